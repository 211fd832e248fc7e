package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/termtext"
)

// Copy runs scp for the plan; a non-zero exit is an *ExitError.
//
// Host to guest, a host tree is checked first: scp -r follows symbolic
// links, so a link in it that leads out of the tree (a repository's
// `notes -> ~/.ssh/id_ed25519`) would hand the guest a host file nobody
// chose to give it; such a tree is refused.
//
// Guest to host, the guest names the files and a repository may have
// planted links where they land, so scp never writes the destination
// itself: it fills a private staging directory beside it, whose entries
// (only regular files and directories, set-uid, set-gid and sticky bits
// cleared) are then renamed into place. Renaming never follows a link, and
// a symbolic link where a file or directory would go is refused, so
// nothing is written outside the destination.
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

// checkHostSource refuses a source that is a symbolic link leading out of
// the directory that holds it: `abox scp repo/* dev:` names every entry of
// a repository, a planted `repo/notes -> ~/.ssh/id_ed25519` among them.
// A link within its own directory (~/.bashrc -> ~/dotfiles/bashrc) is
// fine, and so is naming the file a link leads to.
func checkHostSource(path string) error {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return nil // scp reports a missing source itself
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(path))
	if err != nil {
		return err
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("%s is a symbolic link that does not resolve (%v)", path, err)
	}
	if !within(dir, target) {
		return fmt.Errorf("%s is a symbolic link to %s, outside %s; name %s itself if you mean to give the guest that file", path, target, filepath.Dir(path), target)
	}
	return nil
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
		shown := filepath.Join(path, strings.TrimPrefix(p, root))
		target, err := filepath.EvalSymlinks(p)
		if err != nil {
			return fmt.Errorf("%s is a symbolic link that does not resolve inside %s (%v); scp -r follows links: remove it, or copy what it names on purpose", shown, path, err)
		}
		if !within(root, target) {
			return fmt.Errorf("%s is a symbolic link to %s, outside %s; scp -r follows links, so the guest would get that host file: remove the link, or copy the file it names on purpose", shown, target, path)
		}
		if real, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil && within(target, real) {
			// a -> . or a -> ..: an scp that follows directory links
			// copies the tree into itself (OpenSSH 9's only fails on it
			// midway, with a partial copy); refused whole, up front.
			return fmt.Errorf("%s is a symbolic link to %s, which holds it; scp -r would copy it into itself without end: remove the link", shown, target)
		}
		return nil
	})
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && filepath.IsLocal(rel)
}

// copyOut copies guest files to the host through a staging directory.
func (c copier) copyOut(ctx context.Context, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	dest := p.Dest.Path
	fi, err := os.Lstat(dest)
	exists := err == nil
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	case exists && fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("copying from %s: the destination %s is a symbolic link; name the directory it leads to if you mean it", t.Name(), dest)
	case exists && !fi.IsDir() && !fi.Mode().IsRegular():
		return fmt.Errorf("copying from %s: the destination %s is not a regular file or directory", t.Name(), dest)
	}
	destDir := exists && fi.IsDir()
	parent := dest
	if !destDir {
		parent = filepath.Dir(dest)
	}
	stage, err := os.MkdirTemp(parent, ".abox-scp-")
	if err != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	}
	defer os.RemoveAll(stage)
	sp := p
	sp.Dest = Location{Path: stage + "/"}
	// The guest chooses how much arrives (a sparse terabyte file costs it
	// nothing): the copy stops before it fills the host's file system.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	full := make(chan error, 1)
	reserve := c.reserve
	if reserve == 0 {
		reserve = fsutil.Reserve(stage)
	}
	go func() { full <- watchSpace(wctx, stage, reserve, cancel) }()
	err = c.runSCP(wctx, t, sp, stdout, stderr)
	cancel()
	if ferr := <-full; ferr != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), ferr)
	}
	if err != nil {
		return err
	}
	if err := inertTree(stage); err != nil {
		return fmt.Errorf("copying from %s: %w", t.Name(), err)
	}
	entries, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	var moves [][2]string
	for _, e := range entries {
		to := dest
		if destDir {
			to = filepath.Join(dest, e.Name())
		} else if len(entries) > 1 {
			return fmt.Errorf("copying from %s: %d files arrived, and %s is not a directory", t.Name(), len(entries), dest)
		}
		if err := planMove(filepath.Join(stage, e.Name()), to, &moves); err != nil {
			return fmt.Errorf("copying from %s: %w", t.Name(), err)
		}
	}
	for _, m := range moves {
		if err := os.Rename(m[0], m[1]); err != nil {
			return fmt.Errorf("copying from %s: %w", t.Name(), err)
		}
	}
	return nil
}

// inertTree checks that the staged tree holds only regular files and
// directories and clears set-uid, set-gid and sticky bits: the guest chose
// them, and they would act on the host.
func inertTree(stage string) error {
	return filepath.WalkDir(stage, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return fmt.Errorf("the guest sent %s, which is not a regular file or directory", strings.TrimPrefix(p, stage+"/"))
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if fi.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
			return os.Chmod(p, fi.Mode().Perm())
		}
		return nil
	})
}

// planMove decides the renames that put staged path from at to: a file
// replaces a file, a directory goes where nothing is or merges into a
// directory. A symbolic link at to, or under it where something would go,
// is refused: nothing is written through one.
func planMove(from, to string, moves *[][2]string) error {
	ffi, err := os.Lstat(from)
	if err != nil {
		return err
	}
	tfi, err := os.Lstat(to)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		*moves = append(*moves, [2]string{from, to})
		return nil
	case err != nil:
		return err
	case tfi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link; abox scp does not write through links (remove it, or copy elsewhere)", to)
	case ffi.IsDir() && tfi.IsDir():
		entries, err := os.ReadDir(from)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := planMove(filepath.Join(from, e.Name()), filepath.Join(to, e.Name()), moves); err != nil {
				return err
			}
		}
		return nil
	case ffi.IsDir() || tfi.IsDir():
		return fmt.Errorf("%s exists and one of it and what the guest sent is a directory, the other not", to)
	case !tfi.Mode().IsRegular():
		return fmt.Errorf("%s exists and is not a regular file", to)
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
