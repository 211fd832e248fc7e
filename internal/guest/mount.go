package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/termtext"
)

const mountsFile = "mounts.json"

// Mount is a guest directory mounted on the host with sshfs.
type Mount struct {
	// Dir is the absolute host mount point.
	Dir string `json:"dir"`
	// GuestPath is the guest directory (relative to the login user's home
	// when not absolute; empty is the home).
	GuestPath string `json:"guest_path"`
	ReadOnly  bool   `json:"read_only,omitempty"`
}

// sshfsOptions are the FUSE options of every mount. The guest writes the
// files, so the host must never act on what they claim to be. Symbolic
// links are the way out: a guest-made link x -> /home/me/.bashrc, followed
// by the host's kernel, would let a host program read or overwrite the
// host's own file through the mount. follow_symlinks resolves every link
// in the guest, so the host sees plain files and never a link, and
// contain_symlinks (refused by an sshfs that lacks it, so the mount fails
// closed) rejects any absolute or ".." link that might still be shown.
// nosuid, nodev and noexec keep set-uid programs, device nodes and
// executables written by the guest inert on the host.
var sshfsOptions = []string{"follow_symlinks", "contain_symlinks", "nosuid", "nodev", "noexec", "idmap=user", "reconnect", "ServerAliveInterval=15", "ServerAliveCountMax=3"}

// sshfsArgs builds sshfs's command line. The hardened ssh options travel
// as its ssh_command, split by sshfs on blanks, and inside a FUSE option
// list split on commas: paths holding either are refused rather than
// escaped twice.
func sshfsArgs(t Target, m Mount) ([]string, error) {
	opts, err := instance.SSHOptions(t.Layout, t.State)
	if err != nil {
		return nil, err
	}
	cmd := append([]string{"ssh", "-F", "/dev/null"}, opts...)
	for _, a := range cmd {
		if strings.ContainsAny(a, " \t\n,\\") {
			return nil, fmt.Errorf("mounting from %s: the ssh argument %q holds a blank, comma or backslash, which sshfs cannot pass (move ABOX_HOME to a plain path)", t.Name(), a)
		}
	}
	o := append([]string{"ssh_command=" + strings.Join(cmd, " ")}, sshfsOptions...)
	if m.ReadOnly {
		o = append(o, "ro")
	}
	return []string{"-o", strings.Join(o, ","), instance.SSHDestination(t.State) + ":" + m.GuestPath, m.Dir}, nil
}

// realDir is dir absolute with symbolic links resolved, as the kernel
// lists mount points.
func realDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// ErrNotMounted means no abox mount is at the given place.
var ErrNotMounted = errors.New("not an abox mount")

// mountPoint is dir as the absolute clean path the mount goes on (a
// relative dir joined to the working directory as the kernel has it,
// without links), refused unless that is also its real path: no
// component of dir as given may be a symbolic link. A repository's `mnt
// -> /var/spool/cron/crontabs` (empty, so the emptiness check passes)
// would put the guest's files where the host acts on them, and a
// trailing slash, or a link further up, takes every system call there.
func mountPoint(dir string) (string, error) {
	abs := dir
	if !filepath.IsAbs(dir) {
		wd, err := syscall.Getwd()
		if err != nil {
			return "", err
		}
		abs = filepath.Join(wd, dir)
	}
	clean := filepath.Clean(abs)
	root, err := fsutil.OpenRootNoLinks(dir)
	if err != nil {
		return "", err
	}
	defer root.Close()
	if root.Name() != clean {
		return "", fmt.Errorf("the real path of %s is %s, not %s", termtext.Clean(dir), termtext.Clean(root.Name()), termtext.Clean(clean))
	}
	return clean, nil
}

// Mount mounts m and records it. The mount point must be an empty
// directory that is not already a mount, reached through no symbolic
// link (mountPoint).
func (a Access) Mount(ctx context.Context, t Target, m Mount) error {
	name := t.Name()
	dir, err := mountPoint(m.Dir)
	switch {
	case fsutil.IsLink(err):
		return fmt.Errorf("mounting %s: refusing %s: %w; the host acts on what appears where a link leads: mount on a directory reached without links", name, termtext.Clean(m.Dir), err)
	case errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("mounting %s: %s is not a directory", name, termtext.Clean(m.Dir))
	case err != nil:
		return fmt.Errorf("mounting %s: %w (create the directory first)", name, err)
	}
	m.Dir = dir
	if entries, err := os.ReadDir(dir); err != nil {
		return fmt.Errorf("mounting %s: %w", name, err)
	} else if len(entries) > 0 {
		return fmt.Errorf("mounting %s: %s is not empty; mount on an empty directory so nothing of the host's is hidden", name, dir)
	}
	if mounted, err := isMountPoint(dir); err != nil {
		return err
	} else if mounted {
		return fmt.Errorf("mounting %s: %s is already a mount point", name, dir)
	}
	sshfs, err := lookTool("sshfs", "sshfs")
	if err != nil {
		return err
	}
	args, err := sshfsArgs(t, m)
	if err != nil {
		return err
	}
	return withRecordLock(a.Layout, name, func() error {
		ms, err := loadRecords[Mount](a.Layout, name, mountsFile)
		if err != nil {
			return err
		}
		out, err := exec.CommandContext(ctx, sshfs, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("mounting %s:%s on %s: sshfs: %w: %s", name, m.GuestPath, dir, err, termtext.Clean(strings.TrimSpace(string(out))))
		}
		if err := saveRecords(a.Layout, name, mountsFile, append(ms, m)); err != nil {
			unmount(context.WithoutCancel(ctx), dir)
			return err
		}
		return nil
	})
}

// Mounts lists the recorded mounts of name.
func (a Access) Mounts(name string) ([]Mount, error) {
	return loadRecords[Mount](a.Layout, name, mountsFile)
}

// Unmount unmounts the abox mount at dir, whichever instance it belongs to.
func (a Access) Unmount(ctx context.Context, dir string) (Mount, string, error) {
	abs, err := realDir(dir)
	if err != nil {
		return Mount{}, "", fmt.Errorf("unmounting %s: %w", dir, err)
	}
	states, err := instance.ListStates(a.Layout)
	if err != nil {
		return Mount{}, "", err
	}
	for _, st := range states {
		var found *Mount
		err := withRecordLock(a.Layout, st.Name, func() error {
			ms, err := loadRecords[Mount](a.Layout, st.Name, mountsFile)
			if err != nil {
				return err
			}
			kept := ms[:0]
			for _, m := range ms {
				if m.Dir == abs && found == nil {
					if err := unmount(ctx, m.Dir); err != nil {
						return err
					}
					found = &m
					continue
				}
				kept = append(kept, m)
			}
			return saveRecords(a.Layout, st.Name, mountsFile, kept)
		})
		if err != nil {
			return Mount{}, st.Name, err
		}
		if found != nil {
			return *found, st.Name, nil
		}
	}
	return Mount{}, "", fmt.Errorf("unmounting %s: %w (abox mount lists none there)", abs, ErrNotMounted)
}

// UnmountInstance unmounts every mount of name and returns what it
// unmounted. A mount that will not go is kept in the records.
func (a Access) UnmountInstance(ctx context.Context, name string) ([]Mount, error) {
	var done []Mount
	var errs []error
	err := withRecordLock(a.Layout, name, func() error {
		ms, err := loadRecords[Mount](a.Layout, name, mountsFile)
		if err != nil {
			return err
		}
		kept := ms[:0]
		for _, m := range ms {
			if err := unmount(ctx, m.Dir); err != nil {
				errs = append(errs, err)
				kept = append(kept, m)
				continue
			}
			done = append(done, m)
		}
		return saveRecords(a.Layout, name, mountsFile, kept)
	})
	return done, errors.Join(append(errs, err)...)
}

// unmount detaches the sshfs at dir; one already gone is not an error.
func unmount(ctx context.Context, dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil {
		return err
	}
	if !mounted {
		return nil
	}
	var tries [][]string
	for _, f := range []string{"fusermount3", "fusermount"} {
		if p, err := exec.LookPath(f); err == nil {
			tries = append(tries, []string{p, "-u", dir}, []string{p, "-u", "-z", dir})
			break
		}
	}
	tries = append(tries, []string{"umount", dir}, []string{"umount", "-l", dir})
	var last error
	for _, c := range tries {
		out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput()
		if err == nil {
			return nil
		}
		last = fmt.Errorf("unmounting %s: %s: %w: %s", dir, filepath.Base(c[0]), err, strings.TrimSpace(string(out)))
	}
	return last
}

// isMountPoint reports whether dir is a mount point in this process's
// mount namespace (from /proc/self/mountinfo, whose paths escape blanks).
func isMountPoint(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	return mountinfoHas(f, dir)
}

func mountinfoHas(r io.Reader, dir string) (bool, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountinfo(fields[4]) == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
