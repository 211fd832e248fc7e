package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/doctor"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// TestDoctorBoundsTheGuestsAnswer: doctor's probes run in a hostile guest,
// which may answer with far more than any probe prints; the host keeps a
// bounded part and fails the probe instead of buffering it all. ssh is
// stood in for by a program that answers as such a guest would.
func TestDoctorBoundsTheGuestsAnswer(t *testing.T) {
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\ncat >/dev/null\nhead -c 64M /dev/zero\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	l := paths.Layout{Root: t.TempDir()}
	st := instance.State{Name: "dev", User: "abox"}
	f := l.Instance("dev")
	os.MkdirAll(filepath.Dir(f.SSHKey), 0o700)
	os.WriteFile(f.SSHKey, []byte("key"), 0o600)
	out, err := sshScript(l, st)(t.Context(), "echo probe\n")
	if err == nil || !strings.Contains(err.Error(), "passed") || len(out) > doctor.MaxGuestOutput {
		t.Errorf("a 64 MiB answer: %d bytes kept, err %v", len(out), err)
	}
}
