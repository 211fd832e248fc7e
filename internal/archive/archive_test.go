package archive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ent is one crafted tar entry.
type ent struct {
	hdr  tar.Header
	body []byte
}

func reg(name string, body string) ent {
	return ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Size: int64(len(body)), Mode: 0o600}, body: []byte(body)}
}

func manifestJSON(t testing.TB, files ...File) []byte {
	t.Helper()
	b, err := json.Marshal(Manifest{Format: Format, Version: Version, State: json.RawMessage(`{"name":"dev"}`), Files: files})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// craft writes entries as a gzip'd tar, raw: nothing checks them.
func craft(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range ents {
		h := e.hdr
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// paxArchive is the manifest, then one entry written by hand (Go's tar
// writer overrides a PAX path with the header's name and drops GNU.sparse
// records): a PAX header of records, a ustar header named name of size
// len(body), and body.
func paxArchive(t testing.TB, manifest string, records [][2]string, name string, body []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: ManifestName, Size: int64(len(manifest)), Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(manifest))
	tw.Flush()
	block := func(name string, typ byte, size int) []byte {
		b := make([]byte, 512)
		copy(b, name)
		for i, f := range []string{"0000600", "0000000", "0000000", fmt.Sprintf("%011o", size), "00000000000"} {
			copy(b[[]int{100, 108, 116, 124, 136}[i]:], f)
		}
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		copy(b[148:156], "        ")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	var pax string
	for _, kv := range records {
		rec := " " + kv[0] + "=" + kv[1] + "\n"
		n := len(rec) + 1
		for len(fmt.Sprint(n))+len(rec) != n {
			n = len(fmt.Sprint(n)) + len(rec)
		}
		pax += fmt.Sprint(n) + rec
	}
	gz.Write(block("PaxHeaders/x", tar.TypeXHeader, len(pax)))
	gz.Write(pad512([]byte(pax)))
	gz.Write(block(name, tar.TypeReg, len(body)))
	gz.Write(pad512(body))
	gz.Write(make([]byte, 1024))
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sparseArchive is the manifest, then name as a PAX sparse 1.0 entry of
// realsize zeros from one 512-byte map block.
func sparseArchive(t testing.TB, manifest, name string, realsize int64) []byte {
	t.Helper()
	// One data region, at 0, of 0 bytes: all hole.
	return paxArchive(t, manifest, [][2]string{{"GNU.sparse.major", "1"}, {"GNU.sparse.minor", "0"}, {"GNU.sparse.name", name}, {"GNU.sparse.realsize", fmt.Sprint(realsize)}}, "x", pad512([]byte("1\n0\n0\n")))
}

// pad512 pads b to whole tar blocks.
func pad512(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }

// good is a valid archive: manifest, allowlist, disk.
func good(t testing.TB) []byte {
	return craft(t,
		reg(ManifestName, string(manifestJSON(t, File{Allowlist, 4}, File{DiskQCOW2, 5}))),
		reg(Allowlist, "a.b\n"), reg(DiskQCOW2, "QFI\xfb!"))
}

// readAll reads every entry, returning their bodies or the first error.
func readAll(data []byte) (map[string]string, error) {
	r, err := NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for {
		f, er, err := r.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		b, err := io.ReadAll(er)
		if err != nil {
			return nil, err
		}
		out[f.Name] = string(b)
	}
}

func TestReadsAGoodArchive(t *testing.T) {
	got, err := readAll(good(t))
	if err != nil {
		t.Fatal(err)
	}
	if got[Allowlist] != "a.b\n" || got[DiskQCOW2] != "QFI\xfb!" {
		t.Errorf("entries = %q", got)
	}
}

// TestRefusesHostileArchives crafts one archive per class of attack the
// importer must refuse, and checks the reason names it.
func TestRefusesHostileArchives(t *testing.T) {
	m := func(files ...File) string { return string(manifestJSON(t, files...)) }
	disk := File{DiskQCOW2, 5}
	withType := func(name string, typ byte, link string) ent {
		return ent{hdr: tar.Header{Typeflag: typ, Name: name, Linkname: link, Mode: 0o600}}
	}
	goodBytes := good(t)
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not gzip", []byte("PK\x03\x04 a zip"), "not a gzip stream"},
		{"manifest not first", craft(t, reg(Allowlist, "a.b\n"), reg(ManifestName, m(disk))), "first entry is"},
		{"unknown version", craft(t, reg(ManifestName, `{"format":"abox-instance-archive","version":2,"state":{}}`)), "manifest version 2 is not one this abox reads"},
		{"not an abox archive", craft(t, reg(ManifestName, `{"format":"other","version":1}`)), "not an abox instance archive"},
		{"unknown manifest field", craft(t, reg(ManifestName, `{"format":"abox-instance-archive","version":1,"state":{},"files":[{"name":"disk.qcow2","size":0}],"extra":1}`)), "unknown field"},
		{"manifest without state", craft(t, reg(ManifestName, `{"format":"abox-instance-archive","version":1,"files":[{"name":"disk.qcow2","size":0}]}`)), "no instance state"},
		{"oversized manifest", craft(t, reg(ManifestName, strings.Repeat(" ", MaxManifest+1))), "manifest is"},
		{"path traversal", craft(t, reg(ManifestName, m(disk)), reg("../../etc/cron.d/x", "x")), "path traversal"},
		{"path traversal in manifest", craft(t, reg(ManifestName, m(File{"ssh/../../x", 1}, disk))), "path traversal"},
		{"absolute path", craft(t, reg(ManifestName, m(disk)), reg("/etc/passwd", "x")), "absolute path"},
		{"unclean path", craft(t, reg(ManifestName, m(disk)), reg("ssh//id_ed25519", "x")), "not a clean path"},
		{"unknown entry", craft(t, reg(ManifestName, m(disk)), reg("evil.sh", "x")), "not one an abox archive holds"},
		{"symlink", craft(t, reg(ManifestName, m(File{SSHKey, 0}, disk)), withType(SSHKey, tar.TypeSymlink, "/root/.ssh/id_ed25519")), "symbolic link"},
		{"hardlink", craft(t, reg(ManifestName, m(File{SSHKey, 0}, disk)), withType(SSHKey, tar.TypeLink, "/etc/shadow")), "hard link"},
		{"char device", craft(t, reg(ManifestName, m(disk)), withType(DiskQCOW2, tar.TypeChar, "")), "a device"},
		{"block device", craft(t, reg(ManifestName, m(disk)), withType(DiskQCOW2, tar.TypeBlock, "")), "a device"},
		{"fifo", craft(t, reg(ManifestName, m(disk)), withType(DiskQCOW2, tar.TypeFifo, "")), "a FIFO"},
		{"directory", craft(t, reg(ManifestName, m(disk)), withType("ssh", tar.TypeDir, "")), "a directory"},
		{"duplicate entry", craft(t, reg(ManifestName, m(File{Allowlist, 1}, disk)), reg(Allowlist, "a"), reg(Allowlist, "b")), "appears twice"},
		{"duplicate in manifest", craft(t, reg(ManifestName, m(File{Allowlist, 1}, File{Allowlist, 1}, disk))), "lists \"allowlist.txt\" twice"},
		{"entry not in manifest", craft(t, reg(ManifestName, m(disk)), reg(Allowlist, "a"), reg(DiskQCOW2, "QFI\xfb!")), "where the manifest lists disk.qcow2"},
		{"entry after the last", craft(t, reg(ManifestName, m(disk)), reg(DiskQCOW2, "QFI\xfb!"), reg(Allowlist, "a")), "after the last one"},
		{"missing entry", craft(t, reg(ManifestName, m(File{Allowlist, 1}, disk)), reg(Allowlist, "a")), "ends before disk.qcow2"},
		{"size differs from manifest", craft(t, reg(ManifestName, m(File{DiskQCOW2, 3})), reg(DiskQCOW2, "QFI\xfb!")), "the manifest says 3"},
		{"oversized entry", craft(t, reg(ManifestName, m(File{SSHKey, 2 << 20}, disk))), "over the"},
		{"no disk", craft(t, reg(ManifestName, m(File{Allowlist, 1}))), "exactly one disk"},
		{"two disks", craft(t, reg(ManifestName, m(File{DiskRaw, 1}, disk))), "exactly one disk"},
		{"name in another case", craft(t, reg(ManifestName, m(disk)), reg("Disk.qcow2", "QFI\xfb!")), "not one an abox archive holds"},
		{"newline in a name", craft(t, reg(ManifestName, m(disk)), reg("disk.qcow2\n", "QFI\xfb!")), "not one an abox archive holds"},
		{"NUL in a PAX path", paxArchive(t, m(disk), [][2]string{{"path", "disk.qcow2\x00/../../x"}}, DiskQCOW2, []byte("QFI\xfb!")), "invalid tar header"},
		{"traversal in a PAX path", paxArchive(t, m(disk), [][2]string{{"path", "../../etc/cron.d/x"}}, DiskQCOW2, []byte("QFI\xfb!")), "path traversal"},
		{"PAX size over the header's", paxArchive(t, m(File{DiskQCOW2, 4096}), [][2]string{{"size", "4096"}}, DiskQCOW2, []byte("QFI\xfb!")), "truncated"},
		{"traversal in a GNU long name", craft(t, reg(ManifestName, m(disk)), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "../" + strings.Repeat("y", 120), Size: 5, Mode: 0o600, Format: tar.FormatGNU},
			body: []byte("QFI\xfb!")}), "path traversal"},
		{"PAX size under the manifest's", craft(t, reg(ManifestName, m(disk)), ent{hdr: tar.Header{Typeflag: tar.TypeReg, Name: DiskQCOW2, Size: 3, Mode: 0o600, Format: tar.FormatPAX,
			PAXRecords: map[string]string{"comment": "x"}}, body: []byte("QFI")}), "the manifest says 5"},
		{"sparse entry", sparseArchive(t, m(File{DiskRaw, 1 << 20}), DiskRaw, 1<<20), "sparse file"},
		{"truncated inside an entry", goodBytes[:len(goodBytes)-30], "truncated"},
		{"data after the stream", append(append([]byte{}, goodBytes...), "trailing"...), "after the compressed stream"},
		{"second gzip member", append(append([]byte{}, goodBytes...), good(t)...), "after the compressed stream"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := readAll(c.data)
			var ae *Error
			if !errors.As(err, &ae) {
				t.Fatalf("read = %v, want an archive refusal containing %q", err, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("read = %v, want %q", err, c.want)
			}
		})
	}
}

// TestTruncatedEntryFailsTheEntry: a stream cut inside the disk fails the
// disk's read, so the importer never takes a short disk for a whole one.
func TestTruncatedEntryFailsTheEntry(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	data := craft(t, reg(ManifestName, string(manifestJSON(t, File{DiskRaw, int64(len(big))}))), reg(DiskRaw, big))
	for _, cut := range []int{len(data) / 2, len(data) - 8} {
		_, err := readAll(data[:cut])
		if err == nil || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("cut at %d of %d: %v, want truncated", cut, len(data), err)
		}
	}
}

func TestCorruptChecksumIsRefused(t *testing.T) {
	data := good(t)
	// The gzip trailer's CRC32 is the 8 bytes before the size.
	data[len(data)-8] ^= 0xff
	if _, err := readAll(data); err == nil {
		t.Fatal("an archive with a bad gzip checksum was read")
	}
}

func TestWriterRoundTripAndAtomicity(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "dev.abox")
	m := Manifest{State: json.RawMessage(`{"name":"dev"}`), Files: []File{{Allowlist, 4}, {DiskQCOW2, 3}}}
	w, err := Create(dest, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Add(Allowlist, strings.NewReader("a.b\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dest); err == nil {
		t.Fatal("the archive exists before Commit")
	}
	// A disk that ends early (changed meanwhile) fails, and Abort leaves
	// no file at all.
	if err := w.Add(DiskQCOW2, strings.NewReader("ab")); err == nil {
		t.Fatal("a short entry was written")
	}
	w.Abort()
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("an aborted export left %v", ents)
	}

	w, err = Create(dest, m)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []struct{ n, b string }{{Allowlist, "a.b\n"}, {DiskQCOW2, "abc"}} {
		if err := w.Add(e.n, strings.NewReader(e.b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("archive mode %v, want 0600 (it holds private keys)", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %v, want the archive only", ents)
	}
	data, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	got, err := readAll(data)
	if err != nil {
		t.Fatal(err)
	}
	if got[Allowlist] != "a.b\n" || got[DiskQCOW2] != "abc" {
		t.Errorf("read back %q", got)
	}
}

func TestNextRefusesAnUnreadEntry(t *testing.T) {
	r, err := NewReader(bytes.NewReader(good(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Next(); err == nil {
		t.Fatal("Next skipped an entry the caller had not read")
	}
}
