package cli

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// TestProvisionScriptThroughALinkIsRefused: `abox provision dev -s
// scripts/setup.sh` on a repository's `scripts -> ~/.ssh` would send the
// host file of that name to the guest; nothing reaches ssh.
func TestProvisionScriptThroughALinkIsRefused(t *testing.T) {
	bin := t.TempDir()
	sent := filepath.Join(t.TempDir(), "sent")
	os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\ncat > "+sent+"\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	home := t.TempDir()
	saveState(t, home, instance.State{Name: "dev", User: "abox", Gateway: netip.MustParseAddr("10.10.9.1")})
	key := paths.Layout{Root: home}.Instance("dev").SSHKey
	os.MkdirAll(filepath.Dir(key), 0o700)
	os.WriteFile(key, []byte("key"), 0o600)
	t.Setenv(paths.EnvHome, home)
	secrets := t.TempDir()
	os.WriteFile(filepath.Join(secrets, "setup.sh"), []byte("HOST SECRET\n"), 0o600)
	t.Chdir(t.TempDir())
	os.Symlink(secrets, "scripts")
	var out bytes.Buffer
	code := Main([]string{"provision", "dev", "-s", "scripts/setup.sh"}, strings.NewReader(""), &out, &out)
	if code == 0 || !strings.Contains(out.String(), "scripts is a symbolic link") {
		t.Errorf("exit %d:\n%s", code, out.String())
	}
	if b, err := os.ReadFile(sent); err == nil {
		t.Errorf("ssh was sent %q", b)
	}
}

// TestErrorsCannotDriveTheTerminal: an error names what a repository or a
// guest chose (a path, a file name); abox prints it escaped.
func TestErrorsCannotDriveTheTerminal(t *testing.T) {
	home := t.TempDir()
	saveState(t, home, instance.State{Name: "dev", User: "abox", Gateway: netip.MustParseAddr("10.10.9.1")})
	t.Setenv(paths.EnvHome, home)
	t.Chdir(t.TempDir())
	var out bytes.Buffer
	code := Main([]string{"mount", "dev", "./mnt\x1b]0;owned\x07\x1b[2J/"}, strings.NewReader(""), &out, &out)
	if code == 0 || strings.ContainsAny(out.String(), "\x1b\x07") || !strings.Contains(out.String(), `mnt\x1b]0;owned\x07`) {
		t.Errorf("exit %d: %q", code, out.String())
	}
}
