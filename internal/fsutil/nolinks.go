package fsutil

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/abox-dev/abox/internal/termtext"
)

// LinkError is a path refused because a component of it is a symbolic
// link. A repository can plant one anywhere in its checkout (`results ->
// /etc`), and a trailing slash or a later component makes every
// following system call go through it.
type LinkError struct {
	// Path is the path as it was given.
	Path string
	// Link is the leading part of Path that is the link (`./results`
	// of `./results/cron.d`).
	Link string
	// Target is what the link reads, as written in it.
	Target string
}

func (e *LinkError) Error() string {
	return fmt.Sprintf("%s is a symbolic link (to %s)", termtext.Clean(e.Link), termtext.Clean(e.Target))
}

// OpenRootNoLinks opens the directory path names as an *os.Root without
// following a symbolic link in any component of it: a relative path is
// walked from the working directory, an absolute one from /, one
// component at a time with O_NOFOLLOW, so every component the caller was
// given is a real directory (".." goes to the real parent). A link on the
// way, a trailing slash after one included, is a *LinkError. Links above
// the working directory do not count for a relative path: the kernel
// keeps the working directory as the directory itself.
//
// The root is opened by the walked directory's real path and checked to
// be that same directory, so Name is that path, without links.
func OpenRootNoLinks(path string) (*os.Root, error) {
	fd, err := walkNoLinks(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var want unix.Stat_t
	if err := unix.Fstat(fd, &want); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: path, Err: err}
	}
	real, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	r, err := os.OpenRoot(real)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	fi, err := r.Stat(".")
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || uint64(st.Dev) != uint64(want.Dev) || st.Ino != want.Ino {
		r.Close()
		return nil, fmt.Errorf("opening %s: it changed while it was opened", path)
	}
	return r, nil
}

// walkNoLinks returns an O_PATH descriptor of the directory path names,
// reached without following a link.
func walkNoLinks(path string) (int, error) {
	if path == "" {
		return -1, &fs.PathError{Op: "open", Path: path, Err: unix.ENOENT}
	}
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	start := "."
	if strings.HasPrefix(path, "/") {
		start = "/"
	}
	fd, err := unix.Open(start, flags, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: start, Err: err}
	}
	for i := 0; i < len(path); {
		j := strings.IndexByte(path[i:], '/')
		if j < 0 {
			j = len(path)
		} else {
			j += i
		}
		name := path[i:j]
		i = j + 1
		if name == "" || name == "." {
			continue
		}
		next, err := unix.Openat(fd, name, flags, 0)
		if err != nil {
			lerr := linkAt(fd, path, path[:j], name)
			unix.Close(fd)
			if lerr != nil {
				return -1, lerr
			}
			return -1, &fs.PathError{Op: "open", Path: path[:j], Err: err}
		}
		unix.Close(fd)
		fd = next
	}
	return fd, nil
}

// linkAt is the *LinkError of name in dir when it is a symbolic link,
// and nil otherwise.
func linkAt(dir int, path, prefix, name string) error {
	var st unix.Stat_t
	if unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return nil
	}
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dir, name, buf)
	target := "?"
	if err == nil {
		target = string(buf[:n])
	}
	return &LinkError{Path: path, Link: prefix, Target: target}
}

// IsLink reports whether err is (or wraps) a *LinkError.
func IsLink(err error) bool {
	var le *LinkError
	return errors.As(err, &le)
}
