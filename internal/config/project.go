package config

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/abox-dev/abox/internal/allowlist"
)

// MaxReferencedBytes bounds a file abox.yaml names (template, CA bundle,
// allowlist file).
const MaxReferencedBytes = 4 << 20

// Project is a loaded abox.yaml and the directory its paths are relative
// to. Files it names are read through Root, which refuses any path or
// symbolic link that leads out of the directory.
type Project struct {
	// Path is the absolute path of the abox.yaml.
	Path string
	Dir  string
	Doc  *Doc
	Config
	Root *os.Root
	// snapshot holds what Load read of the files whose content is
	// trusted (allowlist file, CA bundle, template), by project path:
	// the content hashed for trust is the content used, however the
	// files change afterwards.
	snapshot map[string][]byte
	// allowlist is the inline lines and the allowlist file's, merged; a
	// name is never both with and without rules.
	allowlist []allowlist.Line
}

// Load reads, checks and validates the abox.yaml at path.
func Load(path string) (*Project, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	// O_NONBLOCK: an abox.yaml that is a FIFO must be refused, not hang.
	f, err := os.OpenFile(abs, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("reading %s: not a regular file", path)
	}
	d, err := Parse(f, path)
	if err != nil {
		return nil, err
	}
	c, err := d.Validate()
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(filepath.Dir(abs))
	if err != nil {
		return nil, err
	}
	p := &Project{Path: abs, Dir: filepath.Dir(abs), Doc: d, Config: c, Root: root, snapshot: map[string][]byte{}}
	// Every named file must exist and stay inside the project now, so
	// that `up` fails before it makes anything.
	for _, ref := range p.files() {
		b, err := p.ReadFile(ref.key, ref.path)
		if err != nil {
			root.Close()
			return nil, err
		}
		if ref.trusted {
			p.snapshot[ref.path] = b
		}
	}
	if p.allowlist, err = p.mergeAllowlist(); err != nil {
		root.Close()
		return nil, err
	}
	if err := p.checkSecretReach(); err != nil {
		root.Close()
		return nil, err
	}
	if c.Overlay != "" {
		fi, err := root.Stat(c.Overlay)
		if err != nil || !fi.IsDir() {
			root.Close()
			return nil, d.errAt("provision.overlay", "%q: not a directory inside the project (%v)", c.Overlay, err)
		}
	}
	if c.MonitorBundle != "" && c.MonitorBundle != "release" {
		fi, err := root.Stat(c.MonitorBundle)
		if err != nil || !fi.Mode().IsRegular() {
			root.Close()
			return nil, d.errAt("monitor.bundle", "%q: not a file inside the project (%v)", c.MonitorBundle, err)
		}
	}
	return p, nil
}

// Close releases the project directory.
func (p *Project) Close() error { return p.Root.Close() }

type ref struct {
	key, path string
	// trusted: the content widens the sandbox, so it is part of what
	// trust is given to, and read once.
	trusted bool
}

// files are the regular files the configuration names, in a fixed order.
func (p *Project) files() []ref {
	var out []ref
	add := func(key, path string, trusted bool) {
		if path != "" {
			out = append(out, ref{key, path, trusted})
		}
	}
	add("allowlist_file", p.AllowlistFile, true)
	add("upstream_ca", p.UpstreamCA, true)
	add("overrides.libvirt.template", p.Template, true)
	for i, s := range p.Scripts {
		add(fmt.Sprintf("provision.scripts[%d]", i), s, false)
	}
	return out
}

// MergedAllowlist is the file's allowlist as allowlist lines: the inline
// items, then the lines of allowlist_file not already given, normalised;
// a name with rules has one line per rule.
func (p *Project) MergedAllowlist() []string {
	out := make([]string, len(p.allowlist))
	for i, ln := range p.allowlist {
		out[i] = ln.String()
	}
	return out
}

// AllowlistList is the merged allowlist as a list.
func (p *Project) AllowlistList() *allowlist.List {
	// mergeAllowlist checked that the lines build.
	l, _ := allowlist.NewLines(p.allowlist)
	return l
}

func (p *Project) mergeAllowlist() ([]allowlist.Line, error) {
	seen := map[string]bool{}
	var out []allowlist.Line
	for _, ln := range p.Config.Allowlist {
		if !seen[ln.String()] {
			seen[ln.String()] = true
			out = append(out, ln)
		}
	}
	if p.AllowlistFile == "" {
		return out, nil
	}
	b, err := p.ReadFile("allowlist_file", p.AllowlistFile)
	if err != nil {
		return nil, err
	}
	l, err := allowlist.Parse(bytes.NewReader(b), filepath.Join(p.Dir, p.AllowlistFile))
	if err != nil {
		return nil, p.Doc.errAt("allowlist_file", "%v", err)
	}
	if l.Len() > MaxEntries {
		return nil, p.Doc.errAt("allowlist_file", "%d entries; at most %d", l.Len(), MaxEntries)
	}
	for _, ln := range l.Lines() {
		if !seen[ln.String()] {
			seen[ln.String()] = true
			out = append(out, ln)
		}
	}
	// A name with rules in one place and without in the other: the
	// builder names both, with the file's line; abox.yaml's items have
	// their abox.yaml line.
	merged, err := allowlist.NewLines(out)
	if err != nil {
		return nil, p.Doc.errAt("allowlist_file", "%s and allowlist together: %v", p.AllowlistFile, err)
	}
	if msg := p.Config.tunnelledRules(merged); msg != "" {
		return nil, p.Doc.errAt("allowlist_file", "%s", msg)
	}
	return out, nil
}

// ReadFile reads a file the configuration names at key, confined to the
// project directory and bounded in size. A file whose content is trusted
// is the copy Load read.
func (p *Project) ReadFile(key, rel string) ([]byte, error) {
	if b, ok := p.snapshot[rel]; ok {
		return slices.Clone(b), nil
	}
	var b bytes.Buffer
	if err := p.copyFile(key, rel, &b, MaxReferencedBytes); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// CopyFile copies a file the configuration names at key, confined to the
// project directory and at most max bytes, into a new 0600 file in dir, and
// returns its path.
func (p *Project) CopyFile(key, rel, dir string, max int64) (string, error) {
	out, err := os.CreateTemp(dir, "referenced-*")
	if err != nil {
		return "", err
	}
	defer out.Close()
	if err := p.copyFile(key, rel, out, max); err != nil {
		os.Remove(out.Name())
		return "", err
	}
	return out.Name(), out.Close()
}

func (p *Project) copyFile(key, rel string, w io.Writer, max int64) error {
	// O_NONBLOCK: opening a FIFO the repository planted must not hang.
	f, err := p.Root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return p.Doc.errAt(key, "%q: %v (it must be a file inside %s)", rel, err, p.Dir)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return p.Doc.errAt(key, "%q: %v", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return p.Doc.errAt(key, "%q is not a regular file", rel)
	}
	if fi.Size() > max {
		return p.Doc.errAt(key, "%q is %d bytes; at most %d", rel, fi.Size(), max)
	}
	n, err := io.Copy(w, io.LimitReader(f, max+1))
	if err != nil {
		return p.Doc.errAt(key, "%q: %v", rel, err)
	}
	if n > max {
		return p.Doc.errAt(key, "%q grew past %d bytes", rel, max)
	}
	return nil
}

// FS is the project directory as a file system confined to it.
func (p *Project) FS() fs.FS { return p.Root.FS() }
