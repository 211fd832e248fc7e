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

// CheckExecutable refuses to let a process of euid run path (after its
// symbolic links) unless the file is a regular file owned by root or euid
// and writable by neither its group nor others, and every directory above
// it is owned by root or euid and writable by neither its group nor others
// (unless sticky, as /tmp is: there only an entry's owner may replace it).
// Anyone else who could write the file or swap it would have their code
// run with euid's rights, root's for abox.
func CheckExecutable(path string, euid int) error {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	for p := resolved; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner to check", p)
		}
		what := "the directory " + p + " above it"
		if p == resolved {
			what = p
			if !fi.Mode().IsRegular() {
				return fmt.Errorf("%s is not a regular file", p)
			}
		}
		if uid := int(st.Uid); uid != 0 && uid != euid {
			return fmt.Errorf("%s is owned by uid %d, not by root or uid %d", what, uid, euid)
		}
		if fi.Mode().Perm()&0o022 != 0 && (p == resolved || fi.Mode()&os.ModeSticky == 0) {
			return fmt.Errorf("%s is writable by its group or others (mode %v)", what, fi.Mode().Perm())
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}
