package instance

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/abox-dev/abox/internal/paths"
)

// Files abox writes for an instance are private: keys, the CA, the state,
// the allowlist, logs and the guest's disk are 0600 in directories that
// are 0700, except for the two directories QEMU must traverse to open its
// disk, seed and serial log (the instance directory and logs/), which are
// 0710 with libvirt's QEMU group: QEMU can walk through them, nobody else
// can, and no one but root can list them. libvirt's DAC driver hands the
// disk, seed and serial log to the QEMU user while the guest runs and
// gives them back at shutdown, so those files need no group bits either.

// QEMUGroup is the group libvirt runs QEMU under on Debian.
const QEMUGroup = "libvirt-qemu"

// Modes of what abox writes.
const (
	PrivateFile os.FileMode = 0o600
	PrivateDir  os.FileMode = 0o700
	// QEMUDir is for directories on QEMU's way to its files.
	QEMUDir os.FileMode = 0o710
)

// qemuGID is the numeric group of QEMUGroup, or -1 when the host has no
// such group (then QEMU's directories fall back to 0711: search by anyone,
// no listing, every file in them still 0600).
func qemuGID() int {
	g, err := user.LookupGroup(QEMUGroup)
	if err != nil {
		return -1
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return -1
	}
	return gid
}

// makeQEMUDir creates dir (if needed) as root:QEMUGroup 0710.
func makeQEMUDir(dir string) error {
	if err := os.MkdirAll(dir, PrivateDir); err != nil {
		return err
	}
	gid := qemuGID()
	if gid < 0 {
		return os.Chmod(dir, 0o711)
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		return fmt.Errorf("giving %s to group %s: %w", dir, QEMUGroup, err)
	}
	return os.Chmod(dir, QEMUDir)
}

// makePrivateDir creates dir (if needed) 0700.
func makePrivateDir(dir string) error {
	if err := os.MkdirAll(dir, PrivateDir); err != nil {
		return err
	}
	return os.Chmod(dir, PrivateDir)
}

// CheckPrivate walks an instance's directory and returns one line for
// every file or directory whose mode is looser than the rules above (and
// for anything that is neither a file, a socket nor a directory). It is
// what the tests of a created and of a running instance check.
func CheckPrivate(l paths.Layout, name string) ([]string, error) {
	f := l.Instance(name)
	want := map[string]os.FileMode{f.Dir: QEMUDir, f.LogsDir: QEMUDir}
	if qemuGID() < 0 {
		want[f.Dir], want[f.LogsDir] = 0o711, 0o711
	}
	var bad []string
	err := filepath.WalkDir(f.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode()
		switch {
		case mode.IsDir():
			w, ok := want[path]
			if !ok {
				w = PrivateDir
			}
			if mode.Perm() != w {
				bad = append(bad, fmt.Sprintf("%s: directory mode %04o, want %04o", path, mode.Perm(), w))
			}
		case mode.IsRegular():
			if mode.Perm()&0o077 != 0 {
				bad = append(bad, fmt.Sprintf("%s: mode %04o, want 0600 (no group or other access)", path, mode.Perm()))
			}
		case mode&fs.ModeSocket != 0:
			// Connecting needs write permission on the socket.
			if mode.Perm()&0o022 != 0 {
				bad = append(bad, fmt.Sprintf("%s: socket mode %04o, want no group or other write (connect) bit", path, mode.Perm()))
			}
		default:
			bad = append(bad, fmt.Sprintf("%s: unexpected file type %s", path, mode.Type()))
		}
		return nil
	})
	return bad, err
}
