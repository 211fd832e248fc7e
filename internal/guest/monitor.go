package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/limitio"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/tetragon"
)

// AgentSetup is the record of the guest side's last setup
// (paths.Instance.MonitorAgent), shown by `abox monitor status`.
type AgentSetup struct {
	// Bundle is the sha256 of the bundle installed, "" without one.
	Bundle string `json:"bundle,omitempty"`
	// Installed: this setup copied the bundle in (a later one found it).
	Installed bool      `json:"installed,omitempty"`
	At        time.Time `json:"at"`
	TookMS    int64     `json:"took_ms"`
	Error     string    `json:"error,omitempty"`
}

// ReadAgentSetup reads the record; a missing one is the zero value.
func ReadAgentSetup(path string) (AgentSetup, error) {
	var a AgentSetup
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return a, nil
	}
	if err != nil {
		return a, err
	}
	return a, json.Unmarshal(b, &a)
}

// How long the guest side's setup may take: the bundle (about 80 MB)
// crosses SSH to an emulated guest and is unpacked there.
const (
	agentStartTimeout   = 60 * time.Second
	agentInstallTimeout = 15 * time.Minute
)

// StartMonitorAgent brings up the guest side of a monitored instance once
// the guest is ready: it enables and starts the forwarder and, when the
// instance has a bundle, Tetragon, installing the bundle first when the
// guest does not have that one (the first boot). cloud-init wrote the
// forwarder in its init stage, after systemd had planned the boot, so
// nothing starts it on the first boot but this; enabled once, both start
// on every later boot by themselves.
func StartMonitorAgent(ctx context.Context, t Target, progress io.Writer) (err error) {
	st := t.State
	if !st.Monitor {
		return nil
	}
	f := t.Layout.Instance(st.Name)
	rec := AgentSetup{At: time.Now().UTC()}
	defer func() {
		rec.TookMS = time.Since(rec.At).Milliseconds()
		if err != nil {
			rec.Error = err.Error()
		}
		if b, jerr := json.Marshal(rec); jerr == nil {
			fsutil.WriteFileAtomic(f.MonitorAgent, append(b, '\n'), instance.PrivateFile)
		}
	}()
	b := st.MonitorBundle
	if b == nil {
		return t.agentRun(ctx, "sudo -n systemctl enable --now "+cloudinit.MonitorUnit, nil, agentStartTimeout)
	}
	rec.Bundle = b.SHA256
	err = t.agentRun(ctx, cloudinit.TetragonStartCommand(b.SHA256), nil, agentStartTimeout)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Code != 3 {
		return err
	}
	// Not installed yet. Check the cached copy again: it is what the
	// guest gets.
	info, err := tetragon.ValidateFile(b.Path)
	if err != nil {
		return fmt.Errorf("%w (recreate the instance, or give the bundle again)", err)
	}
	if info.SHA256 != b.SHA256 {
		return fmt.Errorf("monitor bundle %s: the cached copy now has sha256 %s, not the %s checked at create; refusing to install it", b.Path, info.SHA256, b.SHA256)
	}
	fmt.Fprintf(progress, "monitor: installing tetragon in %s from %s (%d MB, sha256 %s)\n", st.Name, b.Source, b.Size>>20, b.SHA256[:12])
	src, err := os.Open(b.Path)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := t.agentRun(ctx, cloudinit.TetragonAgentCommand(b.SHA256, b.Prefix, st.User), src, agentInstallTimeout); err != nil {
		return err
	}
	rec.Installed = true
	fmt.Fprintf(progress, "monitor: tetragon installed and started in %s in %s\n", st.Name, time.Since(rec.At).Round(100*time.Millisecond))
	return nil
}

// agentRun runs command in the guest over SSH with stdin.
func (t Target) agentRun(ctx context.Context, command string, stdin io.Reader, timeout time.Duration) error {
	ssh, err := lookTool("ssh", "openssh-client")
	if err != nil {
		return err
	}
	args, err := t.sshArgs(command)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The guest writes this output, for up to 15 min: only its end is
	// kept (it says why the setup failed).
	out := &limitio.Tail{Max: 2000}
	cmd := exec.CommandContext(ctx, ssh, args...)
	cmd.Stdin = stdin
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		err = exitErr("the monitor's setup in the guest", err)
		var ee *ExitError
		if errors.As(err, &ee) && ee.Code == 3 {
			return err
		}
		// The output is the guest's: cleaned before an operator's terminal
		// shows it.
		return fmt.Errorf("starting the monitor's guest side in %s: %w: %s", t.Name(), err, monitor.Printable(strings.TrimSpace(out.String())))
	}
	return nil
}
