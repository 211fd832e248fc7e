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
