package instance

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/fsutil"
)

// declaredDisk rewrites the archive at src (its state changed by
// editState) so that its disk entry is named disk and declares size
// bytes, and the stream ends after that entry's header: what a gzip
// bomb or a sparse tar entry of a few KiB declares before its zeros. An
// import that starts writing the disk finds it truncated.
func declaredDisk(t *testing.T, src string, editState func(map[string]any), disk string, size int64) string {
	t.Helper()
	rd, m := reopen(t, src, editState)
	out := filepath.Join(t.TempDir(), "bomb.abox")
	of, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer of.Close()
	gz := gzip.NewWriter(of)
	tw := tar.NewWriter(gz)
	var bodies [][]byte
	files := m.Files
	m.Files = nil
	for {
		f, er, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if archive.IsDisk(f.Name) {
			f = archive.File{Name: disk, Size: size}
			m.Files = append(m.Files, f)
			break
		}
		b, _ := io.ReadAll(er)
		bodies = append(bodies, b)
		m.Files = append(m.Files, f)
	}
	if len(m.Files) != len(files) {
		t.Fatalf("rewrote %d entries of %d", len(m.Files), len(files))
	}
	put := func(name string, b []byte, size int64) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600, Format: tar.FormatPAX}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	mb, _ := json.Marshal(m)
	put(archive.ManifestName, mb, int64(len(mb)))
	for i, b := range bodies {
		put(m.Files[i].Name, b, int64(len(b)))
	}
	put(disk, nil, size)
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImportRefusesADiskThatCannotFit: a disk entry that declares more
// than the state's disk can hold, or more than the host's free space, is
// refused before a byte of it is written (without this, a 4 KiB archive
// of a default instance made import write terabytes of zeros until the
// host's file system was full).
func TestImportRefusesADiskThatCannotFit(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	good := plainArchive(t, r)
	free, err := fsutil.FreeBytes(r.m.Layout.Root)
	if err != nil {
		t.Fatal(err)
	}
	const tib = int64(1) << 40
	if free >= 4*tib {
		t.Skipf("the test's file system has %d bytes free, more than the largest disk an archive may declare", free)
	}
	setDisk := func(gib int) func(map[string]any) { return func(m map[string]any) { m["disk_gib"] = gib } }
	cases := []struct {
		name  string
		state func(map[string]any)
		disk  string
		size  int64
		trust bool
		want  string
	}{
		// The state's disk is 1 GiB, a default that needs no trust.
		{"qcow2 larger than the state's disk", nil, archive.DiskQCOW2, 2 << 30, false, "more than the state's 1 GiB disk can hold"},
		{"raw larger than the state's disk", nil, archive.DiskRaw, 1<<30 + 1, false, "more than the state's 1 GiB disk can hold"},
		{"qcow2 of 4 TiB, trusted, on a smaller file system", setDisk(4096), archive.DiskQCOW2, 4 * tib, true, "free some space first"},
		{"raw of 4 TiB, trusted, on a smaller file system", setDisk(4096), archive.DiskRaw, 4 * tib, true, "free some space first"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evil := declaredDisk(t, good, c.state, c.disk, c.size)
			_, _, err := r.m.Import(ctx, evil, ImportOptions{Name: "dev2", Trust: c.trust})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("import = %v, want a refusal containing %q", err, c.want)
			}
			assertNothingLeft(t, r, "dev2")
		})
	}
	// The same archive with a disk that fits imports: the helper's
	// archive is otherwise sound up to the disk.
	evil := declaredDisk(t, good, nil, archive.DiskQCOW2, 1<<20)
	if _, _, err := r.m.Import(ctx, evil, ImportOptions{Name: "dev2"}); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("import of a truncated disk = %v, want truncated", err)
	}
}

// TestImportNeverProbesTheDisk: a disk entry that is a vmdk descriptor
// naming a host path as its extent. qemu-img info without -f probes it as
// vmdk and opens that path (any host file, a device, a FIFO that hangs
// the import); the import must never open it, under either disk name.
func TestImportNeverProbesTheDisk(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	good := plainArchive(t, r)
	fifo := filepath.Join(t.TempDir(), "host-fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	desc := []byte("# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\nRW 2048 FLAT \"" + fifo + "\" 0\n")
	for _, name := range []string{archive.DiskQCOW2, archive.DiskRaw} {
		t.Run(name, func(t *testing.T) {
			evil := rewrap(t, good, nil, func(n string, b []byte) (string, []byte) {
				if archive.IsDisk(n) {
					return name, desc
				}
				return n, b
			})
			// A reader of the FIFO lets this writer's non-blocking open
			// succeed; closing it again gives the reader EOF, so a
			// probing import goes on instead of hanging.
			done, opened := make(chan struct{}), make(chan bool, 1)
			go func() {
				seen := false
				defer func() { opened <- seen }()
				for {
					select {
					case <-done:
						return
					default:
					}
					if fh, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
						seen = true
						fh.Close()
					}
					time.Sleep(time.Millisecond)
				}
			}()
			_, _, err := r.m.Import(ctx, evil, ImportOptions{Name: "dev2"})
			close(done)
			if <-opened {
				t.Errorf("import opened the host path the disk's vmdk descriptor names (import: %v)", err)
			}
			if name == archive.DiskQCOW2 && (err == nil || !strings.Contains(err.Error(), "not a plain qcow2 image")) {
				t.Errorf("import = %v, want a refusal containing %q", err, "not a plain qcow2 image")
			}
			// As raw the descriptor is only the guest's bytes.
			if err == nil {
				if err := r.m.Remove(ctx, "dev2", false); err != nil {
					t.Fatal(err)
				}
			}
			assertNothingLeft(t, r, "dev2")
		})
	}
}

// TestImportKilledBeforeItsStateIsSaved: an import killed (SIGKILL, no
// rollback) after it defined the libvirt objects and before it saved the
// state leaves an instance directory without state and a domain abox does
// not know. The next import of that name says how to clear it, and
// `abox remove --force` does.
func TestImportKilledBeforeItsStateIsSaved(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	good := plainArchive(t, r)
	if _, _, err := r.m.Import(ctx, good, ImportOptions{Name: "dev2"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(r.m.Layout.Instance("dev2").State); err != nil {
		t.Fatal(err)
	}
	_, _, err := r.m.Import(ctx, good, ImportOptions{Name: "dev2"})
	// The fact; the CLI's hint gives the fix (abox remove --force dev2).
	var taken *DomainTakenError
	if !errors.As(err, &taken) || taken.Name != "dev2" || !taken.Import {
		t.Fatalf("import over a killed import's leftovers = %v, want a DomainTakenError of dev2 from an import", err)
	}
	if err := r.m.Remove(ctx, "dev2", true); err != nil {
		t.Fatalf("remove --force of a killed import's leftovers: %v", err)
	}
	assertNothingLeft(t, r, "dev2")
	if _, _, err := r.m.Import(ctx, good, ImportOptions{Name: "dev2"}); err != nil {
		t.Fatalf("import after remove --force: %v", err)
	}
}

// barrier holds every write that contains key until n of them have come
// (or a few seconds passed): two imports held at their disk both passed
// their first collision check.
type barrier struct {
	key     string
	arrived chan struct{}
	all     chan struct{}
	n       int
	mu      sync.Mutex
}

func (b *barrier) Write(p []byte) (int, error) {
	if !strings.Contains(string(p), b.key) {
		return len(p), nil
	}
	b.mu.Lock()
	if b.n--; b.n == 0 {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
	case <-time.After(10 * time.Second):
	}
	return len(p), nil
}

// TestConcurrentImportsOfOneName: two imports of one name, both past
// their first check for the name when they start on the disk: exactly
// one instance results; the other fails naming the collision under the
// global lock and leaves nothing (without that second check it took the
// winner's directory away).
func TestConcurrentImportsOfOneName(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	good := plainArchive(t, r)
	r.m.Progress = &barrier{key: "importing dev2: disk", all: make(chan struct{}), n: 2}
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			_, _, err := r.m.Import(ctx, good, ImportOptions{Name: "dev2"})
			errs <- err
		}()
	}
	ok := 0
	for i := 0; i < 2; i++ {
		err := <-errs
		switch {
		case err == nil:
			ok++
		case !strings.Contains(err.Error(), "an instance of that name exists"):
			t.Errorf("the losing import failed with %v, want the collision", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d of the concurrent imports of dev2 succeeded, want 1", ok)
	}
	if _, err := Load(r.m.Layout, "dev2"); err != nil {
		t.Fatalf("the winner's state: %v", err)
	}
	ents, _ := os.ReadDir(r.m.Layout.Instances())
	for _, e := range ents {
		if e.Name() != "dev" && e.Name() != "dev2" {
			t.Errorf("the loser left %s", e.Name())
		}
	}
}
