package cloudinit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Runner runs a program; ExecRunner is the real one.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs programs on the host with os/exec.
type ExecRunner struct{}

// Run runs name with args and returns its standard output; a failure
// carries the program's standard error.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("running %s: %w: %s", name, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Seed is the three NoCloud documents, rendered.
type Seed struct {
	MetaData, UserData, NetworkConfig []byte
}

// Render renders all three documents of c.
func Render(c Config) (Seed, error) {
	var s Seed
	var err error
	if s.MetaData, err = MetaData(c); err != nil {
		return Seed{}, err
	}
	if s.UserData, err = UserData(c); err != nil {
		return Seed{}, err
	}
	if s.NetworkConfig, err = NetworkConfig(c); err != nil {
		return Seed{}, err
	}
	return s, nil
}

// WriteISO packs the seed into a NoCloud ISO at path with genisoimage.
// cloud-init finds it by the volume label "cidata"; Joliet and Rock Ridge
// keep the file names intact (plain ISO 9660 would upper-case and truncate
// "network-config"). The ISO is built next to path and renamed over it, so
// a failed or interrupted build never leaves a half-written seed.
func WriteISO(ctx context.Context, r Runner, s Seed, path string) error {
	dir := filepath.Dir(path)
	work, err := os.MkdirTemp(dir, ".seed-*")
	if err != nil {
		return fmt.Errorf("writing seed iso %s: %w", path, err)
	}
	defer os.RemoveAll(work)
	files := []struct {
		name string
		data []byte
	}{{"meta-data", s.MetaData}, {"user-data", s.UserData}, {"network-config", s.NetworkConfig}}
	args := []string{"-quiet", "-output", filepath.Join(work, "seed.iso"), "-volid", "cidata", "-joliet", "-rock"}
	for _, f := range files {
		p := filepath.Join(work, f.name)
		if err := os.WriteFile(p, f.data, 0o644); err != nil {
			return fmt.Errorf("writing seed iso %s: %w", path, err)
		}
		args = append(args, p)
	}
	if _, err := r.Run(ctx, "genisoimage", args...); err != nil {
		return fmt.Errorf("writing seed iso %s: %w", path, err)
	}
	iso := filepath.Join(work, "seed.iso")
	// Owner-only: the seed may carry the guest's ssh host private key,
	// and whoever reads it can impersonate the guest to `abox ssh`.
	// QEMU runs as another user, but libvirt's DAC driver hands every
	// disk of a starting domain to that user (dynamic_ownership), so
	// it can still read the seed.
	if err := os.Chmod(iso, 0o600); err != nil {
		return fmt.Errorf("writing seed iso %s: %w", path, err)
	}
	if err := syncFile(iso); err != nil {
		return fmt.Errorf("writing seed iso %s: %w", path, err)
	}
	if err := os.Rename(iso, path); err != nil {
		return fmt.Errorf("writing seed iso %s: %w", path, err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
