package guest

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"strings"
	"syscall"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/termtext"
)

// Limits on what provisioning sends to a guest. A repository's abox.yaml
// names the scripts and the overlay, so their size is someone else's
// choice: they are bounded rather than read whole.
const (
	MaxScriptBytes  = 1 << 20   // one script
	MaxOverlayBytes = 512 << 20 // all regular files of an overlay
	MaxOverlayFiles = 20000     // entries (files and directories) of an overlay
)

// Script is one provisioning script: its name (for messages) and content.
type Script struct {
	Name    string
	Content []byte
}

// ReadScript reads the script name inside root, refusing anything but a
// regular file of at most MaxScriptBytes (and never blocking on a FIFO).
func ReadScript(root *os.Root, name string) (Script, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return Script{}, fmt.Errorf("reading script %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Script{}, fmt.Errorf("reading script %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return Script{}, fmt.Errorf("reading script %s: not a regular file", name)
	}
	if fi.Size() > MaxScriptBytes {
		return Script{}, fmt.Errorf("reading script %s: %d bytes, more than the %d a script may have", name, fi.Size(), MaxScriptBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxScriptBytes+1))
	if err != nil {
		return Script{}, fmt.Errorf("reading script %s: %w", name, err)
	}
	if len(b) > MaxScriptBytes {
		return Script{}, fmt.Errorf("reading script %s: grew past %d bytes while read", name, MaxScriptBytes)
	}
	return Script{Name: name, Content: b}, nil
}

// Overlay is a host directory whose tree is copied into the guest's file
// system at Target (its root by default), owned by root.
type Overlay struct {
	// FS is the directory; an *os.Root's FS keeps every open inside it.
	FS fs.FS
	// Source names the directory in messages.
	Source string
	// Target is an absolute guest directory; empty means /.
	Target string
}

// Plan is one provisioning run: the overlay first, then each script in
// order, stopping at the first failure.
type Plan struct {
	Overlay *Overlay
	Scripts []Script
}

// Provision runs the plan in the guest. Scripts run as root in / with the
// proxy and CA environment the guest's shells have, their stdin closed and
// their output streamed to stdout and stderr, made safe for a terminal
// (the guest writes it: an escape sequence in it could retitle the
// terminal, write its clipboard or overwrite what abox printed). The first
// failing script stops the run with an *ExitError carrying its status.
func Provision(ctx context.Context, t Target, p Plan, stdout, stderr io.Writer) error {
	ssh, err := lookTool("ssh", "openssh-client")
	if err != nil {
		return err
	}
	out, errOut := termtext.NewWriter(stdout), termtext.NewWriter(stderr)
	defer errOut.Flush()
	defer out.Flush()
	stdout, stderr = out, errOut
	if p.Overlay != nil {
		if err := copyOverlay(ctx, ssh, t, *p.Overlay, stderr); err != nil {
			return err
		}
	}
	for _, s := range p.Scripts {
		fmt.Fprintf(stderr, "provisioning %s: running %s\n", t.Name(), s.Name)
		args, err := t.sshArgs(scriptCommand(t, s.Name))
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, ssh, args...)
		cmd.Stdin = strings.NewReader(string(s.Content))
		cmd.Stdout, cmd.Stderr = stdout, stderr
		if err := cmd.Run(); err != nil {
			err = exitErr(s.Name, err)
			var ee *ExitError
			if errors.As(err, &ee) && ee.Code == 255 {
				return fmt.Errorf("provisioning %s: %s: ssh could not reach the guest or the script exited with 255: %w", t.Name(), s.Name, err)
			}
			return fmt.Errorf("provisioning %s: %w", t.Name(), err)
		}
	}
	return nil
}

// provisionShell receives the script on stdin, runs it as root and
// removes it; its exit status is the script's.
const provisionShell = `set -u
d=$(mktemp -d /tmp/abox-provision.XXXXXX) || exit 125
trap 'rm -rf "$d"' EXIT
cat >"$d/script" || exit 125
chmod 700 "$d/script"
cd /
"$d/script" </dev/null`

// scriptCommand is the guest command line that runs one script: sudo with
// the proxy environment, then provisionShell.
func scriptCommand(t Target, name string) string {
	var b strings.Builder
	b.WriteString("sudo -n -H env")
	for _, kv := range guestEnv(t) {
		b.WriteString(" " + shellQuote(kv[0]+"="+kv[1]))
	}
	b.WriteString(" ABOX_SCRIPT=" + shellQuote(path.Base(name)))
	b.WriteString(" DEBIAN_FRONTEND=noninteractive sh -c " + shellQuote(provisionShell))
	return b.String()
}

// guestEnv is the proxy environment of t's guest, from the same table the
// seed's /etc/environment is written from.
func guestEnv(t Target) [][2]string {
	return cloudinit.ProxyEnvironment(cloudinit.Config{Gateway: t.State.Gateway, ProxyPort: t.State.ProxyPort})
}

// copyOverlay streams the overlay as a tar into tar -x in the guest.
func copyOverlay(ctx context.Context, ssh string, t Target, o Overlay, stderr io.Writer) error {
	target := o.Target
	if target == "" {
		target = "/"
	}
	if !path.IsAbs(target) || path.Clean(target) != target {
		return fmt.Errorf("provisioning %s: overlay target %q: want a clean absolute guest path", t.Name(), target)
	}
	entries, total, err := scanOverlay(o)
	if err != nil {
		return fmt.Errorf("provisioning %s: %w", t.Name(), err)
	}
	fmt.Fprintf(stderr, "provisioning %s: copying overlay %s to %s (%d entries, %d bytes)\n", t.Name(), termtext.Clean(o.Source), target, len(entries), total)
	// --no-overwrite-dir keeps the guest's own directories (/etc, /usr)
	// as they are; --no-same-owner makes everything root's.
	cmdline := "sudo -n mkdir -p " + shellQuote(target) + " && sudo -n tar -x -f - -C " + shellQuote(target) + " --no-same-owner --no-overwrite-dir"
	args, err := t.sshArgs(cmdline)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	cmd := exec.CommandContext(ctx, ssh, args...)
	cmd.Stdin = pr
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("provisioning %s: copying overlay: %w", t.Name(), err)
	}
	werr := writeOverlayTar(pw, o, entries)
	pw.CloseWithError(werr)
	rerr := cmd.Wait()
	pr.Close()
	if werr != nil {
		return fmt.Errorf("provisioning %s: copying overlay: %w", t.Name(), werr)
	}
	if rerr != nil {
		return fmt.Errorf("provisioning %s: copying overlay: %w", t.Name(), exitErr("tar in the guest", rerr))
	}
	return nil
}

type overlayEntry struct {
	name string // slash path relative to the overlay, "." excluded
	dir  bool
	mode fs.FileMode
	size int64
}

// scanOverlay lists the overlay, refusing what could reach outside it or
// surprise the guest: symbolic links (they could point at host files, and
// would be copied as their target), devices, pipes and sockets, and trees
// past the size limits.
func scanOverlay(o Overlay) ([]overlayEntry, int64, error) {
	var out []overlayEntry
	var total int64
	err := fs.WalkDir(o.FS, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("reading overlay %s: %w", termtext.Clean(o.Source), err)
		}
		if p == "." {
			return nil
		}
		if len(out) >= MaxOverlayFiles {
			return fmt.Errorf("overlay %s has more than %d entries", termtext.Clean(o.Source), MaxOverlayFiles)
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			return fmt.Errorf("overlay %s: %s is a symbolic link; overlays hold only regular files and directories", termtext.Clean(o.Source), termtext.Clean(p))
		case d.IsDir():
			out = append(out, overlayEntry{name: p, dir: true, mode: 0o755})
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return fmt.Errorf("reading overlay %s: %w", termtext.Clean(o.Source), err)
			}
			total += fi.Size()
			if total > MaxOverlayBytes {
				return fmt.Errorf("overlay %s is larger than %d bytes", termtext.Clean(o.Source), MaxOverlayBytes)
			}
			out = append(out, overlayEntry{name: p, mode: fi.Mode().Perm(), size: fi.Size()})
		default:
			return fmt.Errorf("overlay %s: %s is not a regular file or directory (%s)", termtext.Clean(o.Source), termtext.Clean(p), d.Type())
		}
		return nil
	})
	return out, total, err
}

// writeOverlayTar writes the scanned entries; a file that changed size or
// kind since the scan is an error, not a surprise in the guest.
func writeOverlayTar(w io.Writer, o Overlay, entries []overlayEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: "./" + e.name, Mode: int64(e.mode), Uname: "root", Gname: "root", Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
			h.Name += "/"
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			continue
		}
		f, err := o.FS.Open(e.name)
		if err != nil {
			return fmt.Errorf("reading overlay %s: %w", termtext.Clean(o.Source), err)
		}
		fi, err := f.Stat()
		if err != nil || !fi.Mode().IsRegular() || fi.Size() != e.size {
			f.Close()
			return fmt.Errorf("overlay %s: %s changed while it was copied", termtext.Clean(o.Source), termtext.Clean(e.name))
		}
		h.Typeflag = tar.TypeReg
		h.Size = e.size
		if err := tw.WriteHeader(h); err != nil {
			f.Close()
			return err
		}
		_, err = io.CopyN(tw, f, e.size)
		f.Close()
		if err != nil {
			return fmt.Errorf("overlay %s: %s: %w", termtext.Clean(o.Source), termtext.Clean(e.name), err)
		}
	}
	return tw.Close()
}

// OpenOverlay opens dir as an overlay source confined to itself. dir is
// reached without a symbolic link (fsutil.OpenRootNoLinks): a
// repository's `overlay -> ~/.ssh` would otherwise copy the user's keys
// into the guest.
func OpenOverlay(dir, target string) (*Overlay, *os.Root, error) {
	r, err := fsutil.OpenRootNoLinks(dir)
	if err != nil {
		if fsutil.IsLink(err) {
			return nil, nil, fmt.Errorf("opening overlay %s: %w; an overlay is copied into the guest: remove the link, or name the real directory if you mean to give the guest that", termtext.Clean(dir), err)
		}
		return nil, nil, fmt.Errorf("opening overlay %s: %w", termtext.Clean(dir), err)
	}
	return &Overlay{FS: r.FS(), Source: dir, Target: target}, r, nil
}
