package config

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
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
	p := &Project{Path: abs, Dir: filepath.Dir(abs), Doc: d, Config: c, Root: root}
	// Every named file must exist and stay inside the project now, so
	// that `up` fails before it makes anything.
	for _, ref := range p.files() {
		if _, err := p.ReadFile(ref.key, ref.path); err != nil {
			root.Close()
			return nil, err
		}
	}
	if c.Overlay != "" {
		fi, err := root.Stat(c.Overlay)
		if err != nil || !fi.IsDir() {
			root.Close()
			return nil, d.errAt("provision.overlay", "%q: not a directory inside the project (%v)", c.Overlay, err)
		}
	}
	return p, nil
}

// Close releases the project directory.
func (p *Project) Close() error { return p.Root.Close() }

type ref struct{ key, path string }

// files are the regular files the configuration names, in a fixed order.
func (p *Project) files() []ref {
	var out []ref
	add := func(key, path string) {
		if path != "" {
			out = append(out, ref{key, path})
		}
	}
	add("allowlist_file", p.AllowlistFile)
	add("upstream_ca", p.UpstreamCA)
	add("overrides.libvirt.template", p.Template)
	for i, s := range p.Scripts {
		add(fmt.Sprintf("provision.scripts[%d]", i), s)
	}
	return out
}

// ReadFile reads a file the configuration names at key, confined to the
// project directory and bounded in size.
func (p *Project) ReadFile(key, rel string) ([]byte, error) {
	// O_NONBLOCK: opening a FIFO the repository planted must not hang.
	f, err := p.Root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, p.Doc.errAt(key, "%q: %v (it must be a file inside %s)", rel, err, p.Dir)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, p.Doc.errAt(key, "%q: %v", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, p.Doc.errAt(key, "%q is not a regular file", rel)
	}
	if fi.Size() > MaxReferencedBytes {
		return nil, p.Doc.errAt(key, "%q is %d bytes; at most %d", rel, fi.Size(), MaxReferencedBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxReferencedBytes+1))
	if err != nil {
		return nil, p.Doc.errAt(key, "%q: %v", rel, err)
	}
	if len(b) > MaxReferencedBytes {
		return nil, p.Doc.errAt(key, "%q grew past %d bytes", rel, MaxReferencedBytes)
	}
	return b, nil
}

// FS is the project directory as a file system confined to it.
func (p *Project) FS() fs.FS { return p.Root.FS() }
