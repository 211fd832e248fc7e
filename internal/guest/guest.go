// Package guest reaches into a running instance over its hardened SSH: files
// in and out (scp), provisioning scripts and overlays, port forwards and
// sshfs mounts. Nothing here gives the guest a way into the host: every
// connection is opened by the host, and no host path, agent or service is
// offered to the guest unless the user asks for a reverse forward.
package guest

import (
	"errors"
	"fmt"
	"os/exec"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// Target is one instance as the guest tools see it.
type Target struct {
	Layout paths.Layout
	State  instance.State
}

// Load finds instance name's target.
func Load(l paths.Layout, name string) (Target, error) {
	st, err := instance.Load(l, name)
	if err != nil {
		return Target{}, err
	}
	return Target{Layout: l, State: st}, nil
}

// Name is the instance name.
func (t Target) Name() string { return t.State.Name }

// sshArgs are the ssh arguments that run command in the guest.
func (t Target) sshArgs(command string) ([]string, error) {
	return instance.SSHArgs(t.Layout, t.State, []string{command})
}

// ErrToolMissing is returned when a host program (ssh, scp, sshfs) is not
// installed.
var ErrToolMissing = errors.New("host program not installed")

func lookTool(name, pkg string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s: %w (install %s)", name, ErrToolMissing, pkg)
	}
	return p, nil
}

// ExitError is a guest command's non-zero exit status.
type ExitError struct {
	// What ran: a script name, or "scp".
	What string
	Code int
}

func (e *ExitError) Error() string { return fmt.Sprintf("%s exited with status %d", e.What, e.Code) }

// exitErr turns an *exec.ExitError into an *ExitError for what.
func exitErr(what string, err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return &ExitError{What: what, Code: ee.ExitCode()}
	}
	return err
}

// shellQuote quotes s for a POSIX shell (the guest's login shell parses the
// command ssh sends).
func shellQuote(s string) string { return cloudinit.ShellQuote(s) }
