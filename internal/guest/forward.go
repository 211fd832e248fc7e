package guest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/supervise"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

const forwardsFile = "forwards.json"

// Forward is one port forward of an instance, carried over the instance's
// SSH connection so that it needs no hole in the packet filter.
type Forward struct {
	// HostPort is the port on the host's 127.0.0.1: where a forward
	// listens, or, for a reverse forward, the host service offered.
	HostPort uint16 `json:"host_port"`
	// GuestPort is the guest's 127.0.0.1 port: the service a forward
	// reaches, or where a reverse forward listens in the guest.
	GuestPort uint16 `json:"guest_port"`
	// Reverse offers a host service to the guest. Its traffic does not go
	// through the DNS and HTTP filters: only on explicit request.
	Reverse bool `json:"reverse,omitempty"`
}

// ReverseWarning is shown whenever a reverse forward is added or resumed.
const ReverseWarning = "a reverse forward gives the guest a direct connection to a host service: it bypasses the DNS and HTTP filters and the packet filter"

// ParseForward reads HOSTPORT:GUESTPORT.
func ParseForward(s string, reverse bool) (Forward, error) {
	h, g, ok := strings.Cut(s, ":")
	if !ok {
		return Forward{}, fmt.Errorf("forward %q: want HOSTPORT:GUESTPORT, such as 8080:80", s)
	}
	hp, err := parsePort(h)
	if err != nil {
		return Forward{}, fmt.Errorf("forward %q: host port: %w", s, err)
	}
	gp, err := parsePort(g)
	if err != nil {
		return Forward{}, fmt.Errorf("forward %q: guest port: %w", s, err)
	}
	if !reverse {
		if err := validate.ForwardHostPort(hp); err != nil {
			return Forward{}, fmt.Errorf("forward %q: %w", s, err)
		}
	}
	return Forward{HostPort: hp, GuestPort: gp, Reverse: reverse}, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("%q is not a port (1-65535)", s)
	}
	return uint16(n), nil
}

// String is HOSTPORT:GUESTPORT, the form ParseForward reads.
func (f Forward) String() string {
	return strconv.Itoa(int(f.HostPort)) + ":" + strconv.Itoa(int(f.GuestPort))
}

// Describe says what the forward does, for lists and progress.
func (f Forward) Describe() string {
	if f.Reverse {
		return fmt.Sprintf("guest 127.0.0.1:%d -> host 127.0.0.1:%d (reverse, unfiltered)", f.GuestPort, f.HostPort)
	}
	return fmt.Sprintf("host 127.0.0.1:%d -> guest 127.0.0.1:%d", f.HostPort, f.GuestPort)
}

// key identifies a forward: a host listener port, or a guest one.
func (f Forward) key() string {
	if f.Reverse {
		return "r" + strconv.Itoa(int(f.GuestPort))
	}
	return "l" + strconv.Itoa(int(f.HostPort))
}

// Access keeps an instance's forwards and mounts: recorded, resumed on
// start, released on stop and remove.
type Access struct {
	Layout paths.Layout
	// Exe is the abox binary the forward supervisors run.
	Exe string
	// Progress receives warnings and progress lines; optional.
	Progress io.Writer
}

func (a Access) progress(format string, args ...any) {
	if a.Progress != nil {
		fmt.Fprintf(a.Progress, format+"\n", args...)
	}
}

// ForwardStatus is a recorded forward and whether its supervisor runs.
type ForwardStatus struct {
	Forward
	Active bool `json:"active"`
}

// Forwards lists the recorded forwards of name.
func (a Access) Forwards(name string) ([]ForwardStatus, error) {
	fs, err := loadRecords[Forward](a.Layout, name, forwardsFile)
	if err != nil {
		return nil, err
	}
	out := make([]ForwardStatus, 0, len(fs))
	for _, f := range fs {
		out = append(out, ForwardStatus{Forward: f, Active: a.forwardPID(name, f) != 0})
	}
	return out, nil
}

// ErrForwardExists means the port is already forwarded for this instance.
var ErrForwardExists = errors.New("already forwarded")

// AddForward records f and, when the guest runs, starts it and waits until
// it listens. A host port another program holds is refused.
func (a Access) AddForward(ctx context.Context, t Target, f Forward, running bool) error {
	name := t.Name()
	if f.Reverse {
		a.progress("warning: %s", ReverseWarning)
	} else if err := checkHostPort(f); err != nil {
		return fmt.Errorf("forwarding %s for %s: %w", f, name, err)
	}
	err := withRecordLock(a.Layout, name, func() error {
		fs, err := loadRecords[Forward](a.Layout, name, forwardsFile)
		if err != nil {
			return err
		}
		for _, o := range fs {
			if o.key() == f.key() {
				return fmt.Errorf("forwarding %s for %s: %w (%s)", f, name, ErrForwardExists, o.Describe())
			}
		}
		return saveRecords(a.Layout, name, forwardsFile, append(fs, f))
	})
	if err != nil || !running {
		return err
	}
	if err := a.startForward(ctx, name, f, true); err != nil {
		// Leave nothing half-made: the record goes with the failed start.
		rerr := a.RemoveForward(context.WithoutCancel(ctx), name, f)
		return errors.Join(err, rerr)
	}
	return nil
}

// RemoveForward stops f and deletes its record.
func (a Access) RemoveForward(ctx context.Context, name string, f Forward) error {
	found := false
	err := withRecordLock(a.Layout, name, func() error {
		fs, err := loadRecords[Forward](a.Layout, name, forwardsFile)
		if err != nil {
			return err
		}
		kept := fs[:0]
		for _, o := range fs {
			if o.key() == f.key() {
				found = true
				f = o
				continue
			}
			kept = append(kept, o)
		}
		return saveRecords(a.Layout, name, forwardsFile, kept)
	})
	if err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("removing forward %s of %s: no such forward (see abox forward list %s)", f, name, name)
	}
	a.stopForward(ctx, name, f)
	return nil
}

// checkHostPort is the check of a forward's host port, made when it is
// added and again each time start binds it: the port must be one a
// forward may take and free on loopback now (a host service may have
// taken it since).
func checkHostPort(f Forward) error {
	if err := validate.ForwardHostPort(f.HostPort); err != nil {
		return err
	}
	return hostPortFree(f.HostPort)
}

// hostPortFree checks that no host service holds port on loopback. The
// forward listens on 127.0.0.1 only, but a service on [::1] alone would
// see its IPv4 half taken: host clients of "localhost" would reach the
// guest or the service depending on the address they try first.
func hostPortFree(port uint16) error {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("host port 127.0.0.1:%d is not free: %w", port, err)
	}
	defer ln.Close()
	ln6, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(int(port))))
	switch {
	case err == nil:
		return ln6.Close()
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("host port %d is held by a service on [::1]: %w", port, err)
	}
	return nil // no IPv6 loopback here
}

func (a Access) forwardPIDFile(name string, f Forward) string {
	return filepath.Join(a.Layout.RunDir(name), "forward-"+f.key()+".pid")
}

func (a Access) forwardLog(name string, f Forward) string {
	return filepath.Join(a.Layout.LogsDir(name), "forward-"+f.key()+".log")
}

// superviseArgs is the command line of a forward's supervisor, also how
// its pid is recognised in /proc.
func superviseArgs(name string, f Forward) []string {
	args := []string{"forward", "run", name, f.String()}
	if f.Reverse {
		args = append(args, "--reverse")
	}
	return args
}

func (a Access) forwardPID(name string, f Forward) int {
	b, err := os.ReadFile(a.forwardPIDFile(name, f))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || syscall.Kill(pid, 0) != nil {
		return 0
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(strings.Join(superviseArgs(name, f), "\x00")+"\x00")) {
		return 0
	}
	return pid
}

// startForward launches f's supervisor and, for a forward and with wait,
// waits until the host port accepts connections.
func (a Access) startForward(ctx context.Context, name string, f Forward, wait bool) error {
	if a.forwardPID(name, f) != 0 {
		return nil
	}
	if err := os.MkdirAll(a.Layout.LogsDir(name), 0o700); err != nil {
		return err
	}
	if err := os.MkdirAll(a.Layout.RunDir(name), 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(a.forwardLog(name, f), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(a.Exe, superviseArgs(name, f)...)
	cmd.Env = append(os.Environ(), paths.EnvHome+"="+a.Layout.Root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting forward %s of %s: %w", f, name, err)
	}
	if err := os.WriteFile(a.forwardPIDFile(name, f), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if f.Reverse || !wait {
		return nil
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(f.HostPort)))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("starting forward %s of %s: the forward exited (%v): %s", f, name, err, tail(a.forwardLog(name, f)))
		case <-wctx.Done():
			a.stopForward(context.WithoutCancel(ctx), name, f)
			return fmt.Errorf("starting forward %s of %s: not listening within 30s (is the guest up? `abox ssh %s`): %s", f, name, name, tail(a.forwardLog(name, f)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (a Access) stopForward(ctx context.Context, name string, f Forward) {
	pid := a.forwardPID(name, f)
	defer os.Remove(a.forwardPIDFile(name, f))
	if pid == 0 {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	// forwardPID, not kill(0): an exited supervisor nobody reaps stays a
	// zombie, which kill(0) still finds but whose command line is empty.
	for i := 0; i < 100 && a.forwardPID(name, f) == pid; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The supervisor's group holds its ssh: nothing of it may outlive it.
	syscall.Kill(-pid, syscall.SIGKILL)
}

// tail is the last line of a forward's log, safe for a terminal: ssh's
// messages there can quote what the guest's sshd sent.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	b = bytes.TrimSpace(b)
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return termtext.Clean(string(b))
}

// forwardArgs is ssh's command line for f. ClearAllForwardings would clear
// the -L or -R given here too, so it is left out and -F /dev/null keeps
// every ssh_config forwarding away instead.
func forwardArgs(t Target, f Forward) ([]string, error) {
	opts, err := instance.SSHOptions(t.Layout, t.State)
	if err != nil {
		return nil, err
	}
	args := []string{"-F", "/dev/null", "-N"}
	for i := 0; i < len(opts); i++ {
		if opts[i] == "-o" && i+1 < len(opts) && strings.HasPrefix(opts[i+1], "ClearAllForwardings=") {
			i++
			continue
		}
		args = append(args, opts[i])
	}
	args = append(args, "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=3")
	if f.Reverse {
		args = append(args, "-R", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", f.GuestPort, f.HostPort))
	} else {
		args = append(args, "-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", f.HostPort, f.GuestPort))
	}
	return append(args, instance.SSHDestination(t.State)), nil
}

// RunForward is the body of `abox forward run`: it keeps ssh carrying f,
// restarting it with backoff (the guest reboots, sshd restarts), until ctx
// ends.
func RunForward(ctx context.Context, t Target, f Forward, log io.Writer) error {
	ssh, err := lookTool("ssh", "openssh-client")
	if err != nil {
		return err
	}
	args, err := forwardArgs(t, f)
	if err != nil {
		return err
	}
	return supervise.Run(ctx, supervise.Config{
		Argv:  append([]string{ssh}, args...),
		Env:   os.Environ(),
		Log:   log,
		What:  "ssh",
		Attrs: map[string]string{"forward": f.Describe()},
		// A forward's ssh never outlives its supervisor: a killed
		// supervisor must not leave a port open to the guest.
		DieWithParent: true,
		MinBackoff:    500 * time.Millisecond,
		MaxBackoff:    10 * time.Second,
	})
}

// Resume starts every recorded forward of a started instance (without
// waiting for the guest: each supervisor retries until sshd answers).
func (a Access) Resume(ctx context.Context, name string) error {
	fs, err := loadRecords[Forward](a.Layout, name, forwardsFile)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range fs {
		if f.Reverse {
			a.progress("warning: %s: %s", f.Describe(), ReverseWarning)
		} else if err := checkHostPort(f); err != nil {
			errs = append(errs, fmt.Errorf("not starting forward %s of %s: %w (remove it with abox forward rm %s %s)", f.Describe(), name, err, name, f))
			continue
		}
		a.progress("forward %s", f.Describe())
		if err := a.startForward(ctx, name, f, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Release stops every forward supervisor and unmounts every mount of name;
// the forward records stay so that start brings them back, the mounts'
// records go (a mount point may not exist at the next start).
func (a Access) Release(ctx context.Context, name string) error {
	var errs []error
	fs, err := loadRecords[Forward](a.Layout, name, forwardsFile)
	if err != nil {
		errs = append(errs, err)
	}
	for _, f := range fs {
		a.stopForward(ctx, name, f)
	}
	if _, err := a.UnmountInstance(ctx, name); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
