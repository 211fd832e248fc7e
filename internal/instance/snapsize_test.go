package instance

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/paths"
)

// TestSnapshotSizesNeverProbe: `snapshot list` reads the overlay the
// guest's QEMU can write as qcow2, never probing its format: an overlay
// rewritten into a vmdk descriptor naming a FIFO made a probing qemu-img
// open that host path and hang there.
func TestSnapshotSizesNeverProbe(t *testing.T) {
	needQEMUImg(t)
	l := paths.Layout{Root: t.TempDir()}
	f := l.Instance("dev")
	os.MkdirAll(filepath.Dir(f.Disk), 0o700)
	fifo := filepath.Join(t.TempDir(), "extent")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	desc := "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"" + fifo + "\" 0\n"
	os.WriteFile(f.Disk, []byte(desc), 0o600)
	m := &Manager{Layout: l, Run: qemuRun{}}
	done := make(chan map[string]uint64, 1)
	go func() { done <- m.snapshotSizes(context.Background(), "dev") }()
	select {
	case sizes := <-done:
		if len(sizes) != 0 {
			t.Errorf("sizes %v from a vmdk descriptor", sizes)
		}
	case <-time.After(20 * time.Second):
		os.WriteFile(fifo, nil, 0) // unblock the opener
		t.Fatal("qemu-img opened the path a vmdk descriptor named (the format was probed)")
	}
}
