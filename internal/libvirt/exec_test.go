package libvirt

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRunBoundsOutput: a program that answers without end (the guest's
// side of the readiness probe can) is stopped once its output passes the
// bound, instead of being buffered whole on the host.
func TestRunBoundsOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := ExecRunner{}.Run(ctx, "sh", "-c", "head -c 64M /dev/zero; echo finished >&2")
	if !errors.Is(err, ErrOutputTooLarge) || len(out) > MaxRunStdout {
		t.Errorf("64 MiB of output: %d bytes kept, err %v; want %v", len(out), err, ErrOutputTooLarge)
	}
	// Standard error is cut, not fatal; ordinary output is whole.
	out, err = ExecRunner{}.Run(ctx, "sh", "-c", "head -c 1M /dev/zero >&2; echo ok; exit 3")
	if err == nil || len(err.Error()) > maxRunStderr+200 || strings.TrimSpace(string(out)) != "ok" {
		t.Errorf("1 MiB of stderr: out %q, err of %d bytes", out, len(err.Error()))
	}
	if out, err := (ExecRunner{}).Run(ctx, "echo", "hello"); err != nil || string(out) != "hello\n" {
		t.Errorf("echo: %q %v", out, err)
	}
}
