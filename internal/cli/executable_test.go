package cli

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestExecutableIsChecked: abox runs itself again (the libvirt hook as
// root, the supervisors); a binary others may write is refused with the
// way to install it, before a supervisor or the hook would run it.
func TestExecutableIsChecked(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "abox")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer func(f func() (string, error)) { osExecutable = f }(osExecutable)
	osExecutable = func() (string, error) { return exe, nil }
	if got, err := executable(); err != nil || got != exe {
		t.Fatalf("a 0755 binary of ours: %q, %v", got, err)
	}
	os.Chmod(exe, 0o757)
	_, err := executable()
	var he *hintError
	if err == nil || !strings.Contains(err.Error(), "writable by its group or others") || !errors.As(err, &he) || !strings.Contains(he.hint, "install -o root -g root -m 0755") {
		t.Fatalf("a binary others may write: %v", err)
	}
	l := paths.Layout{Root: t.TempDir()}
	for _, args := range [][]string{{"daemon", "supervise", "dev"}, {"monitor", "supervise", "dev"}} {
		if out, err := runCLI(l, args...); err == nil || !strings.Contains(out+err.Error(), "writable by its group or others") {
			t.Errorf("abox %v with a binary others may write: %v\n%s", args, err, out)
		}
	}
}
