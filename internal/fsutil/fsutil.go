// Package fsutil holds the small file-system helpers every on-disk writer of
// abox uses, so that no reader ever sees a half-written file.
package fsutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// WriteFileAtomic writes data to path through a temporary file in the same
// directory, fsyncs it and renames it into place, so readers (and a crash)
// see either the old or the new content, never a mix.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	ok = true
	if d, err := os.Open(dir); err == nil {
		// Persist the rename itself; failure here only weakens crash safety.
		d.Sync()
		d.Close()
	}
	return nil
}

// Within reports whether path is a clean absolute path strictly below
// dir: no "..", no "." and no doubled slash that could make it mean
// something else than it says.
func Within(path, dir string) bool {
	if dir == "" || !filepath.IsAbs(path) || filepath.Clean(path) != path {
		return false
	}
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// FreeBytes is what an unprivileged writer may still use on dir's file
// system (root may use the reserved blocks too, but the host's other
// programs need them).
func FreeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// Reserve is the free space a large write (a copy out of a guest, an
// imported disk) must leave on dir's file system: 5% of it, at least 1 GiB.
func Reserve(dir string) int64 {
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return 1 << 30
	}
	return max(1<<30, int64(st.Blocks)*st.Bsize/20)
}
