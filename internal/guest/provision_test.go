package guest

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/termtext"
)

// TestProvisionOutputCannotDriveTheTerminal: what a provisioning script
// prints is the guest's, and reaches the operator's terminal through abox
// up and abox provision; escape sequences in it are shown, not obeyed. The
// guest's sshd is stood in for by an ssh that runs the script it is sent
// with the host's sh (the property is the host side of the stream).
func TestProvisionOutputCannotDriveTheTerminal(t *testing.T) {
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\nexec sh -s\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	script := `printf 'title\033]0;pwned\007 clip\033]52;c;cm0gLXJmIH4=\007 csi\302\233'
printf 'up\033[1A\033[2K line\r\nbar 10%%\rbar 99%%\n'
printf 'err\033[31m red\n' >&2
exit 0
`
	var out, errOut bytes.Buffer
	err := Provision(t.Context(), testTarget(t), Plan{Scripts: []Script{{Name: "hostile.sh", Content: []byte(script)}}}, &out, &errOut)
	if err != nil {
		t.Fatalf("provision: %v\nstderr: %s", err, errOut.String())
	}
	for name, got := range map[string]string{"stdout": out.String(), "stderr": errOut.String()} {
		for _, line := range strings.Split(got, "\n") {
			if err := termtext.Check(line); err != nil {
				t.Errorf("%s line %q: %v", name, line, err)
			}
		}
	}
	for _, want := range []string{`title\x1b]0;pwned\x07 clip\x1b]52;c;`, `csi\x9b`, `up\x1b[1A\x1b[2K line` + "\n", "bar 10%\nbar 99%\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%q", want, out.String())
		}
	}
	if !strings.Contains(errOut.String(), `err\x1b[31m red`) {
		t.Errorf("stderr = %q", errOut.String())
	}
}

// TestOverlayThroughALinkIsRefused: `abox provision dev --overlay
// overlay/` on a repository's `overlay -> ~/.ssh` would copy the user's
// keys into the guest's /; the overlay directory is reached without a
// link, with or without the slash, and also not through one further up.
func TestOverlayThroughALinkIsRefused(t *testing.T) {
	ssh := t.TempDir()
	os.WriteFile(filepath.Join(ssh, "id_ed25519"), []byte("HOST SECRET\n"), 0o600)
	os.Mkdir(filepath.Join(ssh, "etc"), 0o755)
	t.Chdir(t.TempDir())
	os.Symlink(ssh, "overlay")
	os.MkdirAll(filepath.Join("real", "etc"), 0o755)
	for _, dir := range []string{"overlay/", "overlay", "./overlay/etc/"} {
		if o, root, err := OpenOverlay(dir, ""); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			if root != nil {
				root.Close()
			}
			t.Errorf("OpenOverlay(%q) = %v, %v; want the link refused", dir, o, err)
		}
	}
	o, root, err := OpenOverlay("real/", "")
	if err != nil {
		t.Fatal(err)
	}
	root.Close()
	if o.Source != "real/" {
		t.Errorf("Source = %q", o.Source)
	}
}

// TestOverlayNamesAreShownEscaped: an overlay entry's name is the
// repository's, and reaches the terminal in the refusal.
func TestOverlayNamesAreShownEscaped(t *testing.T) {
	d := t.TempDir()
	os.Symlink("/etc/shadow", filepath.Join(d, "x\x1b]0;owned\x07"))
	o, root, err := OpenOverlay(d, "")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	_, _, err = scanOverlay(*o)
	if err == nil || termtext.Check(err.Error()) != nil || !strings.Contains(err.Error(), `x\x1b]0;owned\x07`) {
		t.Errorf("err = %q", err)
	}
}
