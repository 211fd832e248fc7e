package tetragon

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"path"
	"strings"
	"testing"
)

// FuzzValidate: whatever tar stream is inside the gzip, Validate does not
// panic, and a bundle it accepts holds only local names, regular files,
// directories and links that stay inside, with the agent present.
func FuzzValidate(f *testing.F) {
	raw := func(es []entry) []byte {
		var buf bytes.Buffer
		zr, _ := gzip.NewReader(bytes.NewReader(tarball(&testing.T{}, es)))
		buf.ReadFrom(zr)
		return buf.Bytes()
	}
	f.Add(raw(goodEntries("")))
	f.Add(raw(goodEntries("tetragon-v1.7.1-amd64/")))
	f.Add(raw(append(goodEntries(""), entry{name: "usr/local/lib/l", link: "x", typ: tar.TypeSymlink})))
	f.Fuzz(func(t *testing.T, data []byte) {
		info, err := Validate(bytes.NewReader(gz(data)), "fuzz")
		if err != nil {
			var be *BundleError
			if !errors.As(err, &be) {
				t.Fatalf("not a BundleError: %v", err)
			}
			return
		}
		tr := tar.NewReader(bytes.NewReader(data))
		agent := false
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("accepted, but the tar does not read: %v", err)
			}
			if h.Typeflag == tar.TypeXGlobalHeader {
				continue
			}
			n := path.Clean(h.Name)
			if strings.HasPrefix(h.Name, "/") || n == ".." || strings.HasPrefix(n, "../") || strings.Contains(h.Name, "\\") {
				t.Fatalf("accepted a name out of the bundle: %q", h.Name)
			}
			switch h.Typeflag {
			case tar.TypeReg, tar.TypeRegA, tar.TypeDir, tar.TypeLink:
			case tar.TypeSymlink:
				if strings.HasPrefix(h.Linkname, "/") || hasDotDot(h.Linkname) {
					t.Fatalf("accepted a link out: %q -> %q", h.Name, h.Linkname)
				}
			default:
				t.Fatalf("accepted type %q for %q", h.Typeflag, h.Name)
			}
			if h.Mode&0o6000 != 0 {
				t.Fatalf("accepted a set-id bit on %q", h.Name)
			}
			if n == path.Join(info.Prefix, BinaryPath) && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeDir {
				agent = true
			}
		}
		if !agent {
			t.Fatalf("accepted without %s: %+v", BinaryPath, info)
		}
	})
}
