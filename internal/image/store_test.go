package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

func TestValidateName(t *testing.T) {
	tests := []struct {
		name string
		ok   bool
	}{
		{"debian-12", true},
		{"ubuntu_24.04", true},
		{"a", true},
		{"A" + strings.Repeat("b", 62), true},
		{"A" + strings.Repeat("b", 63), false},
		{"", false},
		{"12debian", false},
		{".hidden", false},
		{"-x", false},
		{"a/b", false},
		{"..", false},
		{"a b", false},
		{"déb", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateName(tt.name)
			if (err == nil) != tt.ok {
				t.Errorf("ValidateName(%q) = %v, want ok=%v", tt.name, err, tt.ok)
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// leftovers lists everything in the images directory: after a failed
// operation it must hold nothing but the images that existed before.
func leftovers(t *testing.T, s *Store) []string {
	t.Helper()
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestImport(t *testing.T) {
	ctx := context.Background()
	src := writeFile(t, filepath.Join(t.TempDir(), "disk.img"), "raw disk bytes")
	run := &fakeRunner{}
	s := NewStore(t.TempDir(), run, nil)

	img, err := s.Import(ctx, "base1", src)
	if err != nil {
		t.Fatal(err)
	}
	if img.Format != "qcow2" || img.SourceFormat != "raw" || img.Source != src {
		t.Errorf("metadata = %+v, want qcow2 from raw %s", img.Metadata, src)
	}
	data, err := os.ReadFile(img.Disk())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if got, want := img.SHA256, hex.EncodeToString(sum[:]); got != want {
		t.Errorf("sha256 = %s, want %s (of the stored qcow2)", got, want)
	}
	if img.Size != int64(len(data)) || img.VirtualSize != int64(len("raw disk bytes")) {
		t.Errorf("size %d virtual %d, want %d and %d", img.Size, img.VirtualSize, len(data), len("raw disk bytes"))
	}
	if run.called("qemu-img convert -U -f raw -O qcow2 "+src) != 1 {
		t.Errorf("calls = %q, want one qemu-img convert -U -f raw -O qcow2", run.calls)
	}

	got, err := s.Get("base1")
	if err != nil {
		t.Fatal(err)
	}
	if got.SHA256 != img.SHA256 || got.Dir != s.Dir("base1") {
		t.Errorf("Get = %+v, want %+v", got, img)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Name != "base1" {
		t.Errorf("List = %+v, want [base1]", list)
	}
	if got, want := leftovers(t, s), []string{"base1"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("images dir holds %q, want %q", got, want)
	}
}

func TestImportDirectBoot(t *testing.T) {
	dir := t.TempDir()
	src := writeFile(t, filepath.Join(dir, "disk.qcow2"), string(fakeQcow2(2147483648)))
	kernel := writeFile(t, filepath.Join(dir, "vmlinuz-x"), "kernel")
	initrd := writeFile(t, filepath.Join(dir, "initrd-x"), "initrd")
	run := &fakeRunner{}
	s := NewStore(t.TempDir(), run, nil)
	img, err := s.Import(context.Background(), "deb", src, WithDirectBoot(kernel, initrd, Debian12Cmdline))
	if err != nil {
		t.Fatal(err)
	}
	if img.Boot == nil || img.Boot.Cmdline != Debian12Cmdline {
		t.Fatalf("boot = %+v, want cmdline %q", img.Boot, Debian12Cmdline)
	}
	for path, want := range map[string]string{img.KernelPath(): "kernel", img.InitrdPath(): "initrd"} {
		b, err := os.ReadFile(path)
		if err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", path, b, err, want)
		}
	}
	if img.VirtualSize != 2147483648 || img.SourceFormat != "qcow2" {
		t.Errorf("metadata = %+v, want qcow2 of 2 GiB", img.Metadata)
	}
}

func TestImportRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	good := writeFile(t, filepath.Join(dir, "good.img"), "raw")
	// qemu-img's report is a second opinion: a header that passes abox's
	// own check but that qemu-img reads differently is refused too.
	backed := writeFile(t, filepath.Join(dir, "backed.qcow2"), string(fakeQcow2(1<<20)))
	datafile := writeFile(t, filepath.Join(dir, "datafile.qcow2"), string(fakeQcow2(1<<20)))
	run := &fakeRunner{info: map[string]string{
		backed:   `{"format":"qcow2","virtual-size":1,"backing-filename":"/etc/shadow"}`,
		datafile: `{"format":"qcow2","virtual-size":1,"format-specific":{"type":"qcow2","data":{"data-file":"/etc/shadow"}}}`,
	}}
	s := NewStore(t.TempDir(), run, nil)
	if _, err := s.Import(ctx, "existing", good); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, image, file, want string
	}{
		{"backing file", "x", backed, "backing file"},
		{"data file", "x", datafile, "external data file"},
		{"bad name", "../x", good, "invalid image name"},
		{"missing file", "x", filepath.Join(dir, "nope"), "no such file"},
		{"existing name", "existing", good, ErrExists.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Import(ctx, tt.image, tt.file)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Import = %v, want error containing %q", err, tt.want)
			}
			if got := leftovers(t, s); len(got) != 1 || got[0] != "existing" {
				t.Errorf("images dir holds %q, want only existing", got)
			}
		})
	}
}

func TestImportRollsBack(t *testing.T) {
	src := writeFile(t, filepath.Join(t.TempDir(), "disk.img"), "raw")
	run := &fakeRunner{fail: map[string]error{"qemu-img convert": errors.New("disk full")}}
	s := NewStore(t.TempDir(), run, nil)
	_, err := s.Import(context.Background(), "base", src)
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Import = %v, want the convert error", err)
	}
	if got := leftovers(t, s); len(got) != 0 {
		t.Errorf("images dir holds %q after a failed import, want nothing", got)
	}
}

func TestImportConcurrentSameName(t *testing.T) {
	src := writeFile(t, filepath.Join(t.TempDir(), "disk.img"), "raw")
	s := NewStore(t.TempDir(), &fakeRunner{}, nil)
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Import(context.Background(), "same", src)
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		} else if !errors.Is(err, ErrExists) {
			t.Errorf("concurrent import: %v, want nil or ErrExists", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d imports succeeded, want exactly 1", ok)
	}
	if got := leftovers(t, s); len(got) != 1 {
		t.Errorf("images dir holds %q, want only same", got)
	}
}

func TestRemove(t *testing.T) {
	ctx := context.Background()
	src := writeFile(t, filepath.Join(t.TempDir(), "disk.img"), "raw")
	s := NewStore(t.TempDir(), &fakeRunner{}, nil)
	if _, err := s.Import(ctx, "base", src); err != nil {
		t.Fatal(err)
	}

	t.Run("in use", func(t *testing.T) {
		err := s.Remove(ctx, "base", func(string) ([]string, error) { return []string{"dev", "ci"}, nil })
		var inUse *InUseError
		if !errors.As(err, &inUse) || strings.Join(inUse.Users, ",") != "dev,ci" {
			t.Fatalf("Remove = %v, want InUseError naming dev, ci", err)
		}
		if _, err := s.Get("base"); err != nil {
			t.Errorf("image gone after refused remove: %v", err)
		}
	})
	t.Run("usage unknown", func(t *testing.T) {
		err := s.Remove(ctx, "base", func(string) ([]string, error) { return nil, errors.New("store locked") })
		if err == nil || !strings.Contains(err.Error(), "store locked") {
			t.Fatalf("Remove = %v, want the inUse error", err)
		}
		if _, err := s.Get("base"); err != nil {
			t.Errorf("image gone although usage was unknown: %v", err)
		}
	})
	t.Run("not found", func(t *testing.T) {
		if err := s.Remove(ctx, "other", nil); !errors.Is(err, ErrNotFound) {
			t.Errorf("Remove = %v, want ErrNotFound", err)
		}
	})
	t.Run("unused", func(t *testing.T) {
		if err := s.Remove(ctx, "base", func(string) ([]string, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get("base"); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get after remove = %v, want ErrNotFound", err)
		}
		if got := leftovers(t, s); len(got) != 0 {
			t.Errorf("images dir holds %q after remove, want nothing", got)
		}
	})
}

func TestListReportsBrokenImage(t *testing.T) {
	root := t.TempDir()
	s := NewStore(root, &fakeRunner{}, nil)
	if err := os.MkdirAll(filepath.Join(s.dir, "broken"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.dir, ".import-x-123"), 0o755); err != nil {
		t.Fatal(err)
	}
	imgs, err := s.List()
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Errorf("List = %v, %v; want an error naming broken", imgs, err)
	}
	if len(imgs) != 0 {
		t.Errorf("List = %+v, want no images", imgs)
	}
}

func TestPull(t *testing.T) {
	body := strings.Repeat("disk image bytes ", 10000)
	sum := sha256.Sum256([]byte(body))
	good := hex.EncodeToString(sum[:])
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debian.qcow2" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write([]byte(body))
	}))
	defer srv.Close()
	ctx := context.Background()

	t.Run("good checksum", func(t *testing.T) {
		s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
		var last, total int64
		img, err := s.Pull(ctx, "debian", srv.URL+"/debian.qcow2", strings.ToUpper(good), func(stage string, done, tot int64) {
			if stage == "download" {
				last, total = done, tot
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if img.Source != srv.URL+"/debian.qcow2" || img.SourceSHA256 != good {
			t.Errorf("metadata = %+v, want source URL and sha256", img.Metadata)
		}
		if last != int64(len(body)) || total != int64(len(body)) {
			t.Errorf("last progress %d/%d, want %d/%d", last, total, len(body), len(body))
		}
		if got := leftovers(t, s); len(got) != 1 || got[0] != "debian" {
			t.Errorf("images dir holds %q, want only debian", got)
		}
	})

	bad := []struct {
		name, url, sum, want string
	}{
		{"bad checksum", "/debian.qcow2", strings.Repeat("0", 64), "checksum mismatch"},
		{"not found", "/missing", good, "404"},
		{"malformed checksum", "/debian.qcow2", "abc", "not a hex sha256"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
			_, err := s.Pull(ctx, "debian", srv.URL+tt.url, tt.sum, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Pull = %v, want error containing %q", err, tt.want)
			}
			if got := leftovers(t, s); len(got) != 0 {
				t.Errorf("images dir holds %q after a failed pull, want nothing", got)
			}
		})
	}
}

// TestImportRealQemuImg runs the real qemu-img when the host has it: the
// fake above cannot prove that the arguments suit the real tool.
func TestImportRealQemuImg(t *testing.T) {
	need.Program(t, "qemu-img")
	ctx := context.Background()
	raw := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(raw, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	s := NewStore(t.TempDir(), ExecRunner{}, nil)
	img, err := s.Import(ctx, "real", raw)
	if err != nil {
		t.Fatal(err)
	}
	format, vsize, err := Inspect(ctx, ExecRunner{}, img.Disk())
	if err != nil {
		t.Fatal(err)
	}
	if format != "qcow2" || vsize != 1<<20 || img.VirtualSize != 1<<20 {
		t.Errorf("stored image is %s of %d bytes (meta %d), want qcow2 of 1 MiB", format, vsize, img.VirtualSize)
	}
	// A qcow2 pointing at a host file must be refused.
	backed := filepath.Join(t.TempDir(), "backed.qcow2")
	if _, err := (ExecRunner{}).Run(ctx, "qemu-img", "create", "-f", "qcow2", "-F", "qcow2", "-b", img.Disk(), backed); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, "backed", backed); err == nil || !strings.Contains(err.Error(), "backing file") {
		t.Errorf("Import of a backed qcow2 = %v, want refusal", err)
	}
}
