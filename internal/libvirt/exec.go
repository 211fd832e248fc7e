package libvirt

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/abox-dev/abox/internal/limitio"
)

// Bounds on what ExecRunner keeps of a program's output. Some of the
// programs it runs speak for a guest (ssh running the readiness probe in
// it), and a guest can answer without end (result.json a link to
// /dev/zero): the host must not buffer that.
const (
	MaxRunStdout = 4 << 20
	maxRunStderr = 64 << 10
)

// ErrOutputTooLarge is a program that wrote more than MaxRunStdout.
var ErrOutputTooLarge = limitio.ErrTooLarge

// ExecRunner runs programs on the host with os/exec.
type ExecRunner struct{}

// Run runs name with args and returns its standard output; a failure
// carries the program's standard error, which is where ip(8) explains it.
// A program whose standard output passes MaxRunStdout is stopped (its pipe
// is closed) and fails with ErrOutputTooLarge; of its standard error the
// first 64 KiB are kept.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	stdout := &limitio.Buffer{Max: MaxRunStdout, Fail: true}
	stderr := &limitio.Buffer{Max: maxRunStderr}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	err := cmd.Run()
	if stdout.Over() {
		return nil, fmt.Errorf("running %s: %w (more than %d bytes)", name, ErrOutputTooLarge, MaxRunStdout)
	}
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("running %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(stderr.Bytes())))
	}
	return stdout.Bytes(), nil
}
