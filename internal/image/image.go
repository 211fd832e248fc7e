// Package image keeps the base disk images instances are cloned from: import, pull, build, list and remove.
package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
)

// Files inside one image directory <root>/images/<name>/.
const (
	DiskFile   = "disk.qcow2"
	KernelFile = "kernel" // a bzImage, or an ELF vmlinux QEMU enters through PVH
	InitrdFile = "initrd.img"
	MetaFile   = "image.json"
)

// Runner runs a program and returns its standard output. Implementations
// include the program's standard error in the returned error so that a
// failure explains itself. Tests substitute a fake.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs programs with os/exec.
type ExecRunner struct{}

// Run implements Runner.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if msg := tail(stderr.String(), 20); msg != "" {
			return stdout.Bytes(), fmt.Errorf("running %s: %w: %s", name, err, msg)
		}
		if msg := tail(stdout.String(), 20); msg != "" {
			return stdout.Bytes(), fmt.Errorf("running %s: %w: %s", name, err, msg)
		}
		return stdout.Bytes(), fmt.Errorf("running %s: %w", name, err)
	}
	return stdout.Bytes(), nil
}

// tail returns the last n non-empty lines of s joined by "; ".
func tail(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "; ")
}

// Progress reports a long operation: the stage it is in and, for transfers,
// bytes done of total (total is -1 when unknown, 0 for stages without bytes).
type Progress func(stage string, done, total int64)

func (p Progress) report(stage string, done, total int64) {
	if p != nil {
		p(stage, done, total)
	}
}

var nameRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_.-]{0,62}$`)

// ValidateName reports whether name may name a base image. Names become
// directory names, so the pattern excludes separators and leading dots.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("invalid image name %q: want a letter followed by up to 62 letters, digits, '_', '.' or '-'", name)
	}
	return nil
}

// ErrNotFound is returned (wrapped) for an image that does not exist.
var ErrNotFound = errors.New("image not found")

// ErrExists is returned (wrapped) when importing over an existing image.
var ErrExists = errors.New("image already exists")

// InUseError refuses to remove an image that instances still use.
type InUseError struct {
	Name  string
	Users []string // instance names, sorted as the caller returned them
}

func (e *InUseError) Error() string {
	return fmt.Sprintf("image %s is used by %s", e.Name, strings.Join(e.Users, ", "))
}

// Boot describes direct kernel boot: images without a boot loader (the
// debootstrap build) are started with this kernel, initrd and command line.
type Boot struct {
	Kernel  string `json:"kernel"`  // file name inside the image directory
	Initrd  string `json:"initrd"`  // file name inside the image directory, may be empty
	Cmdline string `json:"cmdline"` // e.g. "console=ttyS0 root=/dev/vda rw"
}

// Metadata is what image.json records about a base image.
type Metadata struct {
	Name         string `json:"name"`
	Format       string `json:"format"`        // on-disk format, always "qcow2"
	SourceFormat string `json:"source_format"` // "qcow2" or "raw"
	VirtualSize  int64  `json:"virtual_size"`  // bytes the guest sees
	Size         int64  `json:"size"`          // bytes of disk.qcow2 on the host
	SHA256       string `json:"sha256"`        // hex digest of disk.qcow2
	Source       string `json:"source"`        // file path, URL or build recipe it came from
	SourceSHA256 string `json:"source_sha256,omitempty"`
	// Verified says what vouched for the download ("" for an imported
	// file or a build: see Verification).
	Verified string `json:"verified,omitempty"`
	// Signed is true when the checksum the download was verified with
	// came from a checksum file whose signature gpgv checked against a
	// keyring on this host; SignedBy is the signing key's fingerprint.
	Signed   bool      `json:"signed"`
	SignedBy string    `json:"signed_by,omitempty"`
	Created  time.Time `json:"created"`
	Boot     *Boot     `json:"boot,omitempty"` // nil: the disk boots by itself
}

// Verification describes in one phrase what vouches for the image, for
// listings; a signature is claimed only where one was checked (Signed).
func (m Metadata) Verification() string {
	switch {
	case m.Verified != "":
		return m.Verified
	case strings.HasPrefix(m.Source, "build:"):
		return "built here from Debian packages (apt-verified), unsigned image"
	}
	return "none: imported from a local file"
}

// Image is a stored base image.
type Image struct {
	Metadata
	Dir string // absolute directory holding the files below
}

// Disk is the absolute path of the image's qcow2 file; instances put an
// overlay on it and never write to it.
func (i Image) Disk() string { return filepath.Join(i.Dir, DiskFile) }

// KernelPath is the absolute kernel path for direct kernel boot, or "".
func (i Image) KernelPath() string {
	if i.Boot == nil || i.Boot.Kernel == "" {
		return ""
	}
	return filepath.Join(i.Dir, i.Boot.Kernel)
}

// InitrdPath is the absolute initrd path for direct kernel boot, or "".
func (i Image) InitrdPath() string {
	if i.Boot == nil || i.Boot.Initrd == "" {
		return ""
	}
	return filepath.Join(i.Dir, i.Boot.Initrd)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding %s: %w", path, err)
	}
	return fsutil.WriteFileAtomic(path, append(b, '\n'), 0o644)
}

// fileSHA256 returns the hex sha256 and size of the file at path.
func fileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("hashing %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// copyFile copies src to dst (created with perm), fsyncing dst.
func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return nil
}
