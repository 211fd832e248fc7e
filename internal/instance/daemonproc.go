package instance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/supervise"
)

// ProcessDaemon runs each instance's filters as a detached supervisor
// process (`abox daemon supervise NAME`) that restarts `abox daemon run NAME`
// whenever it exits. While the filters are down nothing listens on the
// gateway, so the guest can neither resolve nor connect: it fails closed.
type ProcessDaemon struct {
	Layout paths.Layout
	// Exe is the abox binary to launch.
	Exe string
	// ReadyTimeout bounds Start's wait for the API; 0 means 30s.
	ReadyTimeout time.Duration
}

// Start implements DaemonControl.
func (d *ProcessDaemon) Start(ctx context.Context, st State) error {
	f := d.Layout.Instance(st.Name)
	if d.PID(st.Name) != 0 {
		return d.waitReady(ctx, st.Name, nil)
	}
	if err := os.MkdirAll(f.LogsDir, 0o700); err != nil {
		return err
	}
	cmd, err := launchSupervisor(d.Layout, d.Exe, "daemon", st.Name, f.DaemonLog)
	if err != nil {
		return fmt.Errorf("launching filter daemon: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := d.waitReady(ctx, st.Name, exited); err != nil {
		cmd.Process.Signal(syscall.SIGTERM)
		return fmt.Errorf("%w\n%s", err, tailFile(f.DaemonLog, 15))
	}
	return nil
}

func (d *ProcessDaemon) waitReady(ctx context.Context, name string, exited <-chan error) error {
	timeout := d.ReadyTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := api.NewClient(d.Layout.Instance(name).APISocket)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		sctx, scancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Status(sctx)
		scancel()
		if err == nil && st.Components["dns"] != nil && st.Components["http"] != nil {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the filter daemon exited before it was ready (%v); its log says:", err)
		case <-ctx.Done():
			return fmt.Errorf("the filter daemon was not ready within %s; its log says:", timeout)
		case <-t.C:
		}
	}
}

// Filters implements DaemonControl: up only when the API answers with both
// filters, whatever pid files say.
func (d *ProcessDaemon) Filters(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := api.NewClient(d.Layout.Instance(name).APISocket).Status(ctx)
	switch {
	case err == nil && st.Components["dns"] != nil && st.Components["http"] != nil:
		return FiltersUp
	case d.PID(name) != 0:
		return FiltersRestarting
	}
	return FiltersDown
}

// Stop implements DaemonControl.
func (d *ProcessDaemon) Stop(ctx context.Context, name string) error {
	pid := d.PID(name)
	if pid == 0 {
		return nil
	}
	return stopSupervisor(ctx, pid, d.Layout.Instance(name).DaemonPID)
}

// PID implements DaemonControl: the supervisor's pid if it is alive and
// really is this instance's supervisor (pids are reused).
func (d *ProcessDaemon) PID(name string) int {
	return supervisorPID(d.Layout.Instance(name).DaemonPID, "daemon", name)
}

// launchSupervisor starts `EXE KIND supervise NAME` detached (its own
// session, so it outlives the abox command that started it), its output
// appended to logPath.
func launchSupervisor(l paths.Layout, exe, kind, name, logPath string) (*exec.Cmd, error) {
	return launchDetached(l, logPath, exe, kind, "supervise", name)
}

// Detach runs exe with args in a session of its own, its output appended
// to logPath, and does not wait for it.
func Detach(l paths.Layout, logPath, exe string, args ...string) error {
	cmd, err := launchDetached(l, logPath, exe, args...)
	if err != nil {
		return err
	}
	go cmd.Wait()
	return nil
}

func launchDetached(l paths.Layout, logPath, exe string, args ...string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", logPath, err)
	}
	defer logf.Close()
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), paths.EnvHome+"="+l.Root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// supervisorPID reads a supervisor's pid file and returns the pid if that
// process is alive and really is `abox KIND supervise NAME` (pids are
// reused).
func supervisorPID(pidFile, kind, name string) int {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !alive(pid) {
		return 0
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || !bytes.Contains(cmdline, []byte(kind+"\x00supervise\x00"+name+"\x00")) {
		return 0
	}
	return pid
}

// stopSupervisor asks a supervisor to stop (it stops its child), waits up
// to 10s, then kills its whole process group.
func stopSupervisor(ctx context.Context, pid int, pidFile string) error {
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			os.Remove(pidFile)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	// The supervisor's process group holds the child too.
	syscall.Kill(-pid, syscall.SIGKILL)
	os.Remove(pidFile)
	return nil
}

func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	// A zombie still answers kill(0); it is gone for our purposes.
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	return true
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Supervise is the body of `abox daemon supervise NAME`: it binds the
// instance's filter sockets once and runs `EXE daemon run NAME` on them,
// restarting it whenever it exits, with backoff, until ctx ends; then it
// stops the child and returns. Because the supervisor holds the sockets for
// its whole life, no other local process can take GATEWAY:53 or the proxy
// port while a filter process restarts: the guest's packets wait in the
// socket queues (or time out) and are answered by the next filter process
// only. Each child is killed if the supervisor dies (Pdeathsig).
func Supervise(ctx context.Context, l paths.Layout, exe, name string, log io.Writer) error {
	f := l.Instance(name)
	st, err := Load(l, name)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.RunDir, 0o700); err != nil {
		return err
	}
	socks, err := daemon.BindSockets(FilterAddrs(st))
	if err != nil {
		return fmt.Errorf("binding the filters' sockets for %s: %w", name, err)
	}
	defer socks.Close()
	if err := socks.BindCapture(CaptureAddrs(st)); err != nil {
		return fmt.Errorf("binding the filters' sockets for %s: %w", name, err)
	}
	if err := fsutil.WriteFileAtomic(f.DaemonPID, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(f.DaemonPID)
	starts := 0 // children started so far: the next one's restart count
	return supervise.Run(ctx, supervise.Config{
		Argv:  []string{exe, "daemon", "run", name},
		Env:   append(os.Environ(), paths.EnvHome+"="+l.Root),
		Log:   log,
		What:  "filters",
		Attrs: map[string]string{"instance": name},
		// Each child gets the supervisor's sockets.
		Prepare: func(cmd *exec.Cmd) (func(), error) {
			files, env, err := socks.Files()
			if err != nil {
				return nil, err
			}
			cmd.Env = append(cmd.Env, env, daemon.EnvStarts+"="+strconv.Itoa(starts))
			starts++
			cmd.ExtraFiles = files
			return func() {
				for _, f := range files {
					f.Close()
				}
			}, nil
		},
		// The child must not outlive the supervisor: an orphan would keep
		// serving with nobody restarting or stopping it.
		DieWithParent: true,
	})
}
