package tetragon

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
	size       int64 // declared size when body is not written (oversize)
}

var elfBody = "\x7fELF fake agent"

// goodEntries is a minimal bundle in upstream's layout, below prefix.
func goodEntries(prefix string) []entry {
	p := func(s string) string { return prefix + s }
	var es []entry
	if prefix != "" {
		es = append(es, entry{name: strings.TrimSuffix(prefix, "/") + "/", typ: tar.TypeDir})
	}
	return append(es,
		entry{name: p("usr/"), typ: tar.TypeDir},
		entry{name: p("usr/local/bin/tetragon"), body: elfBody, mode: 0o755},
		entry{name: p("usr/local/bin/tetra"), body: elfBody, mode: 0o755},
		entry{name: p("usr/local/lib/tetragon/bpf/bpf_execve_event.o"), body: "obj"},
		entry{name: p("usr/local/lib/tetragon/bpf/bpf_generic_kprobe.o"), body: "obj"},
		entry{name: p("install.sh"), body: "#!/bin/sh\n", mode: 0o755},
	)
}

func tarball(t *testing.T, es []entry) []byte {
	t.Helper()
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, e := range es {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Format: tar.FormatPAX}
		if typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if e.size > 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.size > 0 {
			// Declared but not written: the validator must refuse at the header.
			tw.Flush()
			break
		}
		if e.body != "" {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return gz(raw.Bytes())
}

func gz(b []byte) []byte {
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	zw.Close()
	return out.Bytes()
}

func TestValidateGoodBundles(t *testing.T) {
	for _, prefix := range []string{"", "tetragon-v1.7.1-amd64/", "./"} {
		b := tarball(t, goodEntries(prefix))
		info, err := Validate(bytes.NewReader(b), "good.tar.gz")
		if err != nil {
			t.Fatalf("prefix %q: %v", prefix, err)
		}
		sum := sha256.Sum256(b)
		if info.SHA256 != hex.EncodeToString(sum[:]) || info.Size != int64(len(b)) {
			t.Errorf("prefix %q: digest %s size %d, want %x %d", prefix, info.SHA256, info.Size, sum, len(b))
		}
		if info.BPFObjects != 2 || !info.HasCLI || info.Prefix != strings.Trim(strings.TrimPrefix(prefix, "./"), "/") {
			t.Errorf("prefix %q: %+v", prefix, info)
		}
	}
	// A link inside the bundle is fine.
	es := append(goodEntries(""), entry{name: "usr/local/bin/tetragon-agent", link: "tetragon", typ: tar.TypeSymlink},
		entry{name: "usr/local/bin/tetra2", link: "usr/local/bin/tetra", typ: tar.TypeLink})
	if _, err := Validate(bytes.NewReader(tarball(t, es)), "links"); err != nil {
		t.Errorf("links inside the bundle: %v", err)
	}
}

// TestValidateRefusesHostileBundles: each hostile tarball is refused, with
// the reason named.
func TestValidateRefusesHostileBundles(t *testing.T) {
	with := func(extra ...entry) []entry { return append(goodEntries(""), extra...) }
	without := func(name string) []entry {
		var out []entry
		for _, e := range goodEntries("") {
			if e.name != name {
				out = append(out, e)
			}
		}
		return out
	}
	good := tarball(t, goodEntries(""))
	var twoMembers bytes.Buffer
	twoMembers.Write(good)
	twoMembers.Write(tarball(t, []entry{{name: "etc/cron.d/evil", body: "* * * * * root sh\n"}}))
	rawTar := func(es []entry) []byte { // the tar inside, not compressed
		var buf bytes.Buffer
		zr, _ := gzip.NewReader(bytes.NewReader(tarball(t, es)))
		buf.ReadFrom(zr)
		return buf.Bytes()
	}
	trailing := append(rawTar(goodEntries("")), []byte("usr/local/bin/evil\x00")...)
	// A PAX record of GNU's sparse format, patched in over a comment of the
	// same length (tar.Writer will not write one).
	var sparse bytes.Buffer
	tw := tar.NewWriter(&sparse)
	for _, e := range goodEntries("") {
		h := &tar.Header{Name: e.name, Typeflag: tar.TypeDir, Mode: 0o755}
		if e.typ == 0 {
			h = &tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(e.body))}
		}
		tw.WriteHeader(h)
		tw.Write([]byte(e.body))
	}
	tw.WriteHeader(&tar.Header{Name: "usr/local/lib/holes", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1, PAXRecords: map[string]string{"comment": "abcdefghijkl"}})
	tw.Write([]byte("x"))
	tw.Close()
	sparseTar := bytes.Replace(sparse.Bytes(), []byte("comment=abcdefghijkl"), []byte("GNU.sparse.zz=abcdef"), 1)
	cases := []struct {
		name   string
		data   []byte
		reason string
	}{
		{"absolute name", tarball(t, with(entry{name: "/etc/cron.d/evil", body: "x"})), "absolute"},
		{"dot-dot", tarball(t, with(entry{name: "usr/../../etc/passwd", body: "x"})), `".."`},
		{"dot-dot at the end", tarball(t, with(entry{name: "usr/local/..", typ: tar.TypeDir})), `".."`},
		{"backslash", tarball(t, with(entry{name: `usr\..\..\x`, body: "x"})), "backslash"},
		{"absolute symlink", tarball(t, with(entry{name: "usr/local/lib/evil", link: "/etc", typ: tar.TypeSymlink})), "outside"},
		{"escaping symlink", tarball(t, with(entry{name: "usr/local/lib/evil", link: "../../../etc", typ: tar.TypeSymlink})), "outside"},
		{"symlink through a dot-dot", tarball(t, with(entry{name: "s", link: ".", typ: tar.TypeSymlink}, entry{name: "t", link: "s/..", typ: tar.TypeSymlink})), "outside"},
		{"hard link out", tarball(t, with(entry{name: "usr/local/lib/evil", link: "/etc/shadow", typ: tar.TypeLink})), "hard link"},
		{"hard link to nothing", tarball(t, with(entry{name: "usr/local/lib/evil", link: "etc/shadow", typ: tar.TypeLink})), "hard link"},
		{"character device", tarball(t, with(entry{name: "usr/local/lib/mem", typ: tar.TypeChar})), "device"},
		{"block device", tarball(t, with(entry{name: "usr/local/lib/vda", typ: tar.TypeBlock})), "device"},
		{"fifo", tarball(t, with(entry{name: "usr/local/lib/fifo", typ: tar.TypeFifo})), "FIFO"},
		{"setuid", tarball(t, with(entry{name: "usr/local/bin/su", body: elfBody, mode: 0o4755})), "set-user"},
		{"duplicate", tarball(t, with(entry{name: "usr/local/bin/tetragon", link: "/bin/sh", typ: tar.TypeSymlink})), "twice"},
		{"oversized entry", tarball(t, with(entry{name: "usr/local/lib/big", size: MaxFile + 1})), "at most"},
		{"no tetragon", tarball(t, without("usr/local/bin/tetragon")), "no usr/local/bin/tetragon"},
		{"tetragon is a link", tarball(t, append(without("usr/local/bin/tetragon"), entry{name: "usr/local/bin/tetragon", link: "tetra", typ: tar.TypeSymlink})), "no usr/local/bin/tetragon"},
		{"tetragon not ELF", tarball(t, append(without("usr/local/bin/tetragon"), entry{name: "usr/local/bin/tetragon", body: "#!/bin/sh\nrm -rf /\n"})), "not an ELF"},
		{"no BPF objects", tarball(t, without("usr/local/lib/tetragon/bpf/bpf_execve_event.o")[:3]), "no BPF"},
		{"second gzip member", twoMembers.Bytes(), "after the end"},
		{"data after the archive", gz(trailing), "after the end"},
		{"not gzip", rawTar(goodEntries("")), "not gzip"},
		{"truncated", good[:len(good)/2], ""},
		{"shell in the top directory", tarball(t, goodEntries("$(reboot)/")), "top directory"},
		{"sparse file", gz(sparseTar), "sparse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Validate(bytes.NewReader(c.data), "hostile.tar.gz")
			var be *BundleError
			if !errors.As(err, &be) {
				t.Fatalf("accepted (or not a BundleError): %v", err)
			}
			if !strings.Contains(err.Error(), c.reason) || !strings.Contains(err.Error(), "hostile.tar.gz") {
				t.Errorf("error %q does not name %q", err, c.reason)
			}
		})
	}
}

// TestValidateRealBundle checks a real bundle when ABOX_TETRAGON_BUNDLE
// names one (docs/monitor.md says how one is built), and skips otherwise;
// in CI the VM suite's TestTetragonAgent puts the shared bundle through the
// same check (abox create --monitor-bundle).
func TestValidateRealBundle(t *testing.T) {
	file := os.Getenv("ABOX_TETRAGON_BUNDLE")
	if file == "" {
		t.Skip("ABOX_TETRAGON_BUNDLE is not set")
	}
	t0 := time.Now()
	_, info, err := Cache{Dir: t.TempDir()}.Import(file, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE real bundle imported into the cache (copy, digest, check) in %s", time.Since(t0).Round(10*time.Millisecond))
	t.Logf("FIGURE real bundle: %d bytes, %d entries, %d MiB unpacked, %d BPF objects, prefix %q, sha256 %s", info.Size, info.Entries, info.Unpacked>>20, info.BPFObjects, info.Prefix, info.SHA256)
}
