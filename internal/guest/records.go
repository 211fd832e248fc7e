package guest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/paths"
)

// Records of forwards and mounts live in the instance directory, so that
// remove deletes them with it; access.lock serialises their read-modify-
// write (it is not the instance lock, which start and stop hold while they
// call Resume and Release).
func recordPath(l paths.Layout, name, file string) string {
	return filepath.Join(l.InstanceDir(name), file)
}

func withRecordLock(l paths.Layout, name string, f func() error) error {
	p := recordPath(l, name, ".access.lock")
	fh, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("locking %s: %w", p, err)
	}
	defer fh.Close()
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %w", p, err)
	}
	defer syscall.Flock(int(fh.Fd()), syscall.LOCK_UN)
	return f()
}

func loadRecords[T any](l paths.Layout, name, file string) ([]T, error) {
	b, err := os.ReadFile(recordPath(l, name, file))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s of %s: %w", file, name, err)
	}
	var out []T
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("reading %s of %s: damaged: %w", file, name, err)
	}
	return out, nil
}

func saveRecords[T any](l paths.Layout, name, file string, v []T) error {
	if len(v) == 0 {
		if err := os.Remove(recordPath(l, name, file)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(recordPath(l, name, file), append(b, '\n'), 0o600)
}
