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
	"strings"

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
	return copyWith(ctx, scp, nil, t, p, stdout, stderr)
}

// copyWith is Copy with the scp program and extra leading arguments (tests
// give scp an -S program that serves a directory with sftp-server).
func copyWith(ctx context.Context, scp string, extra []string, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	errOut := termtext.NewWriter(stderr)
	defer errOut.Flush()
	if p.Dest.Instance != "" {
		if p.Recursive {
			for _, s := range p.Sources {
				if err := checkHostTree(s.Path); err != nil {
					return fmt.Errorf("copying to %s: %w", t.Name(), err)
				}
			}
		}
		return runSCP(ctx, scp, extra, t, p, stdout, errOut)
	}
	return copyOut(ctx, scp, extra, t, p, stdout, errOut)
}

func runSCP(ctx context.Context, scp string, extra []string, t Target, p CopyPlan, stdout, stderr io.Writer) error {
	args, err := scpArgs(t, p)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, scp, append(extra, args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("copying with %s: %w", t.Name(), exitErr("scp", err))
	}
	return nil
}

// checkHostTree refuses a directory holding a symbolic link whose target
// is outside the directory (or does not resolve). The directory named
// itself may be a link: that is the user's own choice.
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
		return nil
	})
}

func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && filepath.IsLocal(rel)
}

// copyOut copies guest files to the host through a staging directory.
func copyOut(ctx context.Context, scp string, extra []string, t Target, p CopyPlan, stdout, stderr io.Writer) error {
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
	if err := runSCP(ctx, scp, extra, t, sp, stdout, stderr); err != nil {
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
