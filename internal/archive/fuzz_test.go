package archive

import (
	"bytes"
	"errors"
	"io"
	"path"
	"strings"
	"testing"
)

// FuzzReader feeds arbitrary bytes to the archive reader (an archive is
// someone else's input). Whatever it accepts to the end is exactly what
// its manifest lists: known clean names, each once, in order, of the
// declared sizes, one disk and last; every refusal is an *Error whose text
// holds no control character.
func FuzzReader(f *testing.F) {
	f.Add(good(f))
	f.Add(craft(f, reg(ManifestName, string(manifestJSON(f, File{SSHKey, 2}, File{DiskRaw, 1}))), reg(SSHKey, "ab"), reg(DiskRaw, "x")))
	f.Add(craft(f, reg(ManifestName, string(manifestJSON(f, File{DiskQCOW2, 5}))), reg("../x", "QFI\xfb!")))
	f.Add(craft(f, reg(ManifestName, `{"format":"abox-instance-archive","version":2}`)))
	f.Add([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := NewReader(bytes.NewReader(data))
		if err != nil {
			checkRefusal(t, err)
			return
		}
		m := r.Manifest()
		if err := m.Check(); err != nil {
			t.Fatalf("NewReader accepted a manifest Check refuses: %v", err)
		}
		var got []File
		for {
			fl, er, err := r.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				checkRefusal(t, err)
				return
			}
			n, err := io.Copy(io.Discard, er)
			if err != nil {
				checkRefusal(t, err)
				return
			}
			if n != fl.Size {
				t.Fatalf("entry %s gave %d bytes, declared %d", fl.Name, n, fl.Size)
			}
			got = append(got, fl)
		}
		if len(got) != len(m.Files) {
			t.Fatalf("read %d entries, the manifest lists %d", len(got), len(m.Files))
		}
		seen := map[string]bool{}
		for i, fl := range got {
			if fl != m.Files[i] {
				t.Fatalf("entry %d is %v, the manifest lists %v", i, fl, m.Files[i])
			}
			if _, ok := limits[fl.Name]; !ok || seen[fl.Name] || path.Clean(fl.Name) != fl.Name || strings.HasPrefix(fl.Name, "/") || strings.Contains(fl.Name, "..") {
				t.Fatalf("accepted entry %q", fl.Name)
			}
			seen[fl.Name] = true
			if fl.Size > limits[fl.Name] {
				t.Fatalf("accepted %s of %d bytes, over its limit", fl.Name, fl.Size)
			}
		}
		if !IsDisk(got[len(got)-1].Name) {
			t.Fatalf("the last entry %s is not a disk", got[len(got)-1].Name)
		}
	})
}

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("refusal %v (%T) is not an *archive.Error", err, err)
	}
	for _, c := range err.Error() {
		if c < 0x20 || c == 0x7f {
			t.Fatalf("refusal %q holds a control character", err)
		}
	}
}
