package guest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/termtext"
)

// Copy runs scp for the plan; a non-zero exit is an *ExitError.
//
// A repository may plant symbolic links anywhere in its checkout, so no
// host path the user gave is used through one: every component of it
// (from the working directory for a relative path, from / for an
// absolute one) must be a real directory, the trailing slash of shell
// completion making no difference (fsutil.OpenRootNoLinks).
//
// Host to guest, scp -r follows symbolic links, so a link in a host tree
// that leads out of it (a repository's `notes -> ~/.ssh/id_ed25519`)
// would hand the guest a host file nobody chose to give it; such a tree
// is refused, and so is a source reached through a link, or one that is
// a link out of the directory holding it.
//
// Guest to host, the guest names the files and a repository may have
// planted links where they land, so scp never writes the destination
// itself: it fills a private staging directory in the destination's
// directory, opened once without a link, whose entries (only regular
// files and directories, set-uid, set-gid and sticky bits cleared) are
// then renamed into place through that same handle (an os.Root). Renaming
// never follows a link, a symbolic link where a file or directory would
// go is refused, and the root keeps every rename inside the destination.
func Copy(ctx context.Context, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	scp, err := lookTool("scp", "openssh-client")
	if err != nil {
		return err
	}
	return copier{scp: scp}.copy(ctx, t, p, stdout, stderr)
}

// copier runs one copy.
type copier struct {
	scp string
	// extra are leading scp arguments (tests give an -S program that
	// serves a directory with sftp-server).
	extra []string
	// reserve is the free space in bytes a copy out leaves on the host;
	// 0 is fsutil.Reserve's.
	reserve int64
}

func (c copier) copy(ctx context.Context, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	errOut := termtext.NewWriter(stderr)
	defer errOut.Flush()
	if p.Dest.Instance != "" {
		for _, s := range p.Sources {
			if err := checkHostSource(s.Path); err != nil {
				return fmt.Errorf("copying to %s: %w", t.Name(), err)
			}
			if p.Recursive {
				if err := checkHostTree(s.Path); err != nil {
					return fmt.Errorf("copying to %s: %w", t.Name(), err)
				}
			}
		}
		return c.runSCP(ctx, t, p, stdout, errOut)
	}
	return c.copyOut(ctx, t, p, stdout, errOut)
}

func (c copier) runSCP(ctx context.Context, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	args, err := scpArgs(t, p)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, c.scp, append(slices.Clone(c.extra), args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("copying with %s: %w", t.Name(), exitErr("scp", err))
	}
	return nil
}

// checkHostSource refuses a source reached through a symbolic link:
// every component of the path as given (from the working directory, or
// from / for an absolute path) must be a real directory, so a planted
// `repo/docs -> ~/.ssh` is refused whether the user names repo/docs/ (the
// slash makes scp follow it) or repo/docs/id_ed25519. The source itself
// may be a link that leads inside the directory that holds it
// (~/.bashrc -> ~/dotfiles/bashrc), not out of it: `abox scp repo/* dev:`
// names every entry of a repository, a planted `repo/notes ->
// ~/.ssh/id_ed25519` among them. Naming the file a link leads to is fine.
func checkHostSource(path string) error {
	dir, base := splitLast(path)
	root, err := fsutil.OpenRootNoLinks(dir)
	if err != nil {
		if fsutil.IsLink(err) {
			return fmt.Errorf("refusing %s: %w; scp would follow it and give the guest what it leads to: remove the link, or name the real path if you mean to give the guest that", termtext.Clean(path), err)
		}
		return err
	}
	defer root.Close()
	if base == "" {
		return nil
	}
	fi, err := root.Lstat(base)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return nil // scp reports a missing source itself
	}
	shown := termtext.Clean(strings.TrimRight(path, "/"))
	target, err := filepath.EvalSymlinks(filepath.Join(root.Name(), base))
	if err != nil {
		return fmt.Errorf("%s is a symbolic link that does not resolve (%v)", shown, err)
	}
	if !within(root.Name(), target) {
		t := termtext.Clean(target)
		return fmt.Errorf("%s is a symbolic link to %s, outside %s; name %s itself if you mean to give the guest that file", shown, t, termtext.Clean(dir), t)
	}
	return nil
}

// splitLast splits path (trailing slashes dropped) into the directory
// that holds its last component and that component's name; the name is
// empty when path ends in ".", ".." or is "/", which are directories by
// their syntax.
func splitLast(path string) (dir, name string) {
	p := strings.TrimRight(path, "/")
	if p == "" {
		return path, ""
	}
	i := strings.LastIndexByte(p, '/')
	dir, name = strings.TrimRight(p[:i+1], "/"), p[i+1:]
	switch {
	case i < 0:
		dir = "."
	case dir == "":
		dir = "/"
	}
	if name == "." || name == ".." {
		return path, ""
	}
	return dir, name
}

// checkHostTree refuses a directory holding a symbolic link whose target
// is outside the directory (or does not resolve).
func checkHostTree(path string) error {
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil // scp reports a missing source itself
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink == 0 {
			return nil
		}
		// The names are the repository's: shown escaped.
		shown := termtext.Clean(filepath.Join(path, strings.TrimPrefix(p, root)))
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%s is a symbolic link that does not resolve inside %s (%s); scp -r follows links: remove it, or copy what it names on purpose", shown, termtext.Clean(path), termtext.Clean(err.Error()))
		}
		if !within(root, target) {
			return fmt.Errorf("%s is a symbolic link to %s, outside %s; scp -r follows links, so the guest would get that host file: remove the link, or copy the file it names on purpose", shown, termtext.Clean(target), termtext.Clean(path))
		}
		if real, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil && within(target, real) {
			// a -> . or a -> ..: an scp that follows directory links
			// copies the tree into itself (OpenSSH 9's only fails on it
			// midway, with a partial copy); refused whole, up front.
			return fmt.Errorf("%s is a symbolic link to %s, which holds it; scp -r would copy it into itself without end: remove the link", shown, termtext.Clean(target))
		}
		return nil
	})
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && filepath.IsLocal(rel)
}

// openDest opens the directory a copy out lands in, reached without a
// symbolic link (fsutil.OpenRootNoLinks), and returns the name the copy
// takes in it: empty when dest is that directory (the copy goes inside
// it), the file's name otherwise. A dest that is a link, or ends in a
// slash and is no directory, is refused.
func openDest(dest string) (root *os.Root, name string, err error) {
	dir, base := splitLast(dest)
	root, err = fsutil.OpenRootNoLinks(dir)
	if err != nil || base == "" {
		return root, "", err
	}
	fi, err := root.Lstat(base)
	slash := strings.HasSuffix(dest, "/")
	switch {
	case errors.Is(err, fs.ErrNotExist) && !slash:
		return root, base, nil
	case err != nil:
		root.Close()
		return nil, "", err
	case fi.Mode()&fs.ModeSymlink != 0:
		target, _ := root.Readlink(base)
		root.Close()
		return nil, "", &fsutil.LinkError{Path: dest, Link: strings.TrimRight(dest, "/"), Target: target}
	case fi.IsDir():
		root.Close()
		root, err = fsutil.OpenRootNoLinks(dest)
		return root, "", err
	case !fi.Mode().IsRegular():
		root.Close()
		return nil, "", fmt.Errorf("%s is not a regular file or directory", termtext.Clean(dest))
	case slash:
		root.Close()
		return nil, "", fmt.Errorf("%s is not a directory", termtext.Clean(dest))
	}
	return root, base, nil
}

// copyOut copies guest files to the host through a staging directory.
// The destination's directory is opened once, reached without a link,
// and the staging, the checks and the renames all go through that
// handle, so nothing lands outside it.
func (c copier) copyOut(ctx context.Context, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	dest := p.Dest.Path
	root, name, err := openDest(dest)
	if err != nil {
		if fsutil.IsLink(err) {
			return fmt.Errorf("copying from %s: refusing the destination %s: %w; abox scp does not write through links: remove the link, or name the directory it leads to if you mean it", t.Name(), termtext.Clean(dest), err)
		}
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	}
	defer root.Close()
	// Where the destination's entries are shown from in messages.
	shownDir := dest
	if name != "" {
		shownDir, _ = splitLast(dest)
	}
	show := func(rel string) string { return termtext.Clean(filepath.Join(shownDir, rel)) }
	stage, err := makeStage(root)
	if err != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	}
	defer root.RemoveAll(stage)
	stagePath := filepath.Join(root.Name(), stage)
	sp := p
	sp.Dest = Location{Path: stagePath + "/"}
	// The guest chooses how much arrives (a sparse terabyte file costs it
	// nothing): the copy stops before it fills the host's file system.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	full := make(chan error, 1)
	reserve := c.reserve
	if reserve == 0 {
		reserve = fsutil.Reserve(stagePath)
	}
	go func() { full <- watchSpace(wctx, stagePath, reserve, cancel) }()
	err = c.runSCP(wctx, t, sp, stdout, stderr)
	cancel()
	if ferr := <-full; ferr != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), ferr)
	}
	if err != nil {
		return err
	}
	if err := inertTree(root, stage); err != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	}
	entries, err := fs.ReadDir(root.FS(), stage)
	if err != nil {
		return err
	}
	var moves [][2]string
	for _, e := range entries {
		to := e.Name()
		if name != "" {
			if len(entries) > 1 {
				return fmt.Errorf("copying from %s: %d files arrived, and %s is not a directory", t.Name(), len(entries), termtext.Clean(dest))
			}
			to = name
		}
		if err := planMove(root, path.Join(stage, e.Name()), to, show, &moves); err != nil {
			return fmt.Errorf("copying from %s: %w", t.Name(), err)
		}
	}
	for _, m := range moves {
		if err := root.Rename(m[0], m[1]); err != nil {
			return fmt.Errorf("copying from %s: moving %s into place: %s", t.Name(), show(m[1]), termtext.Clean(err.Error()))
		}
	}
	return nil
}

// makeStage makes a private staging directory in root and returns its
// name.
func makeStage(root *os.Root) (string, error) {
	for {
		name := ".abox-scp-" + strings.ToLower(rand.Text()[:12])
		err := root.Mkdir(name, 0o700)
		if !errors.Is(err, fs.ErrExist) {
			return name, err
		}
	}
}

// inertTree checks that the staged tree holds only regular files and
// directories and clears set-uid, set-gid and sticky bits: the guest chose
// them, and they would act on the host.
func inertTree(root *os.Root, stage string) error {
	return fs.WalkDir(root.FS(), stage, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("the guest sent %s, which is not a regular file or directory", termtext.Clean(strings.TrimPrefix(p, stage+"/")))
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			return root.Chmod(p, fi.Mode().Perm())
		}
		return nil
	})
}

// planMove decides the renames inside root that put staged path from at
// to: a file replaces a file, a directory goes where nothing is or merges
// into a directory. A symbolic link at to, or under it where something
// would go, is refused: nothing is written through one. show names a
// path of root in messages.
func planMove(root *os.Root, from, to string, show func(string) string, moves *[][2]string) error {
	ffi, err := root.Lstat(from)
	if err != nil {
		return err
	}
	tfi, err := root.Lstat(to)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		*moves = append(*moves, [2]string{from, to})
		return nil
	case err != nil:
		return err
	case tfi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link; abox scp does not write through links (remove it, or copy elsewhere)", show(to))
	case ffi.IsDir() && tfi.IsDir():
		entries, err := fs.ReadDir(root.FS(), from)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := planMove(root, path.Join(from, e.Name()), path.Join(to, e.Name()), show, moves); err != nil {
				return err
			}
		}
		return nil
	case ffi.IsDir() || tfi.IsDir():
		return fmt.Errorf("%s exists and one of it and what the guest sent is a directory, the other not", show(to))
	case !tfi.Mode().IsRegular():
		return fmt.Errorf("%s exists and is not a regular file", show(to))
	}
	*moves = append(*moves, [2]string{from, to})
	return nil
}

// ErrHostDiskFull is a copy out of the guest stopped before it filled the
// host's file system.
var ErrHostDiskFull = errors.New("the copy would fill the host's file system")

// watchSpace polls the free space of dir's file system until ctx ends,
// and stops the copy (stop) once less than reserve is left.
func watchSpace(ctx context.Context, dir string, reserve int64, stop func()) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if free, err := fsutil.FreeBytes(dir); err == nil && free < reserve {
			stop()
			return fmt.Errorf("%w: %s has %d bytes free, less than the %d a copy leaves; nothing was kept (copy less, or free space)", ErrHostDiskFull, dir, free, reserve)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
