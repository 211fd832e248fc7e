package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Store keeps base images under <root>/images/<name>/. Every image directory
// appears by a single rename of a fully written temporary directory, so a
// crash or a failed import never leaves a half image under a valid name;
// leftovers are dot-named and ignored by List.
type Store struct {
	dir    string // <root>/images, absolute
	run    Runner
	client *http.Client
	now    func() time.Time
}

// NewStore returns the store under root (the abox data root, ABOX_HOME).
// run runs qemu-img; client fetches pulls (nil means http.DefaultClient).
func NewStore(root string, run Runner, client *http.Client) *Store {
	if client == nil {
		client = http.DefaultClient
	}
	return &Store{dir: filepath.Join(root, "images"), run: run, client: secureClient(client), now: time.Now}
}

// Dir is the directory the named image lives in (whether or not it exists).
func (s *Store) Dir(name string) string { return filepath.Join(s.dir, name) }

// Get returns the named image.
func (s *Store) Get(name string) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	dir := s.Dir(name)
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("reading image %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return Image{}, fmt.Errorf("reading image %s: %w", name, err)
	}
	var m Metadata
	if err := json.Unmarshal(b, &m); err != nil {
		return Image{}, fmt.Errorf("reading image %s: %s: %w", name, MetaFile, err)
	}
	return Image{Metadata: m, Dir: dir}, nil
}

// List returns the stored images sorted by name. A directory whose metadata
// cannot be read is reported as an error naming it, so it can be removed.
func (s *Store) List() ([]Image, error) {
	entries, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing images: %w", err)
	}
	var imgs []Image
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || ValidateName(e.Name()) != nil {
			continue // temporary and trash directories start with a dot
		}
		img, err := s.Get(e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		imgs = append(imgs, img)
	}
	sort.Slice(imgs, func(i, j int) bool { return imgs[i].Name < imgs[j].Name })
	return imgs, errors.Join(errs...)
}

// ImportOption adjusts an import.
type ImportOption func(*importConfig)

type importConfig struct {
	boot         *Boot  // source paths of kernel and initrd, copied in
	source       string // recorded instead of the file path
	sourceSHA256 string
	verified     string
	signedBy     string // fingerprint of the key whose signature vouched for the checksum file
}

// WithDirectBoot imports a kernel and initrd (host paths, copied into the
// image) and the kernel command line to boot the disk with.
func WithDirectBoot(kernel, initrd, cmdline string) ImportOption {
	return func(c *importConfig) { c.boot = &Boot{Kernel: kernel, Initrd: initrd, Cmdline: cmdline} }
}

// withVerified records what vouched for a download, and the fingerprint
// of the key that signed its checksum file ("" when nothing was signed).
func withVerified(v, signedBy string) ImportOption {
	return func(c *importConfig) { c.verified, c.signedBy = v, signedBy }
}

// WithSource records where the image came from instead of the file path.
func WithSource(source, sha256 string) ImportOption {
	return func(c *importConfig) { c.source, c.sourceSHA256 = source, sha256 }
}

// Import copies file (qcow2 or raw) into the store as a qcow2 named name.
// Nothing is left behind when it fails.
func (s *Store) Import(ctx context.Context, name, file string, opts ...ImportOption) (Image, error) {
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	if _, err := os.Stat(s.Dir(name)); err == nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, ErrExists)
	}
	format, vsize, err := Inspect(ctx, s.run, abs)
	if err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	tmp, err := os.MkdirTemp(s.dir, ".import-"+name+"-")
	if err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	committed := false
	defer func() {
		if !committed {
			os.RemoveAll(tmp)
		}
	}()
	// 0755 so that the unprivileged qemu user libvirt runs guests as can
	// read the base through the overlay.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}

	// convert, not copy, for qcow2 too: it normalises the file (no
	// compression or encryption surprises, no external data file). The
	// format is the one Inspect checked, never probed again; the result
	// is inspected again before anything can use it.
	disk := filepath.Join(tmp, DiskFile)
	if _, err := s.run.Run(ctx, "qemu-img", "convert", "-U", "-f", format, "-O", "qcow2", abs, disk); err != nil {
		return Image{}, fmt.Errorf("importing image %s: converting to qcow2: %w", name, err)
	}
	if err := os.Chmod(disk, 0o644); err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	if gotFormat, gotSize, err := Inspect(ctx, s.run, disk); err != nil {
		return Image{}, fmt.Errorf("importing image %s: checking the converted disk: %w", name, err)
	} else if gotFormat != "qcow2" || gotSize != vsize {
		return Image{}, fmt.Errorf("importing image %s: the converted disk is %s of %d bytes, want qcow2 of %d", name, gotFormat, gotSize, vsize)
	}
	sum, size, err := fileSHA256(disk)
	if err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	meta := Metadata{
		Name:         name,
		Format:       "qcow2",
		SourceFormat: format,
		VirtualSize:  vsize,
		Size:         size,
		SHA256:       sum,
		Source:       abs,
		SourceSHA256: cfg.sourceSHA256,
		Verified:     cfg.verified,
		Signed:       cfg.signedBy != "",
		SignedBy:     cfg.signedBy,
		Created:      s.now().UTC(),
	}
	if cfg.source != "" {
		meta.Source = cfg.source
	}
	if b := cfg.boot; b != nil {
		if b.Kernel == "" {
			return Image{}, fmt.Errorf("importing image %s: direct boot needs a kernel", name)
		}
		meta.Boot = &Boot{Kernel: KernelFile, Cmdline: b.Cmdline}
		if err := copyFile(b.Kernel, filepath.Join(tmp, KernelFile), 0o644); err != nil {
			return Image{}, fmt.Errorf("importing image %s: %w", name, err)
		}
		if b.Initrd != "" {
			meta.Boot.Initrd = InitrdFile
			if err := copyFile(b.Initrd, filepath.Join(tmp, InitrdFile), 0o644); err != nil {
				return Image{}, fmt.Errorf("importing image %s: %w", name, err)
			}
		}
	}
	if err := writeJSON(filepath.Join(tmp, MetaFile), meta); err != nil {
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	// A directory rename onto an existing non-empty directory fails, so a
	// concurrent import of the same name loses cleanly instead of mixing.
	if err := os.Rename(tmp, s.Dir(name)); err != nil {
		if errors.Is(err, fs.ErrExist) || strings.Contains(err.Error(), "directory not empty") {
			return Image{}, fmt.Errorf("importing image %s: %w", name, ErrExists)
		}
		return Image{}, fmt.Errorf("importing image %s: %w", name, err)
	}
	committed = true
	return Image{Metadata: meta, Dir: s.Dir(name)}, nil
}

// InUseFunc returns the instances that use the named base image.
type InUseFunc func(name string) ([]string, error)

// Remove deletes the named image unless inUse reports users (then the error
// is an *InUseError). The directory is first renamed away, so the name is
// free at once and a crash mid-delete leaves only a dot-named leftover.
func (s *Store) Remove(ctx context.Context, name string, inUse InUseFunc) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	dir := s.Dir(name)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing image %s: %w", name, ErrNotFound)
	} else if err != nil {
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	if inUse != nil {
		users, err := inUse(name)
		if err != nil {
			return fmt.Errorf("removing image %s: finding instances that use it: %w", name, err)
		}
		if len(users) > 0 {
			return &InUseError{Name: name, Users: users}
		}
	}
	trash, err := os.MkdirTemp(s.dir, ".remove-"+name+"-")
	if err != nil {
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	gone := filepath.Join(trash, name)
	if err := os.Rename(dir, gone); err != nil {
		os.Remove(trash)
		return fmt.Errorf("removing image %s: %w", name, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("removing image %s: deleting files: %w", name, err)
	}
	return nil
}
