package instance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/supervise"
)

// MonitorControl runs an instance's host-side monitor. Its failures are
// reported, never fatal: the seed requires that a failed monitor leaves the
// instance running normally.
type MonitorControl interface {
	Start(ctx context.Context, st State) error
	Stop(ctx context.Context, name string) error
	PID(name string) int
}

// Monitor log rotation: what a flooding guest can make abox keep on disk.
const (
	monitorLogMaxMB    = 16
	monitorLogBackups  = 3
	monitorReadyWithin = 10 * time.Second
)

// MonitorProcess runs `abox monitor supervise NAME`, a detached supervisor
// that restarts `abox monitor run NAME` whenever it exits.
type MonitorProcess struct {
	Layout paths.Layout
	Exe    string
}

// Start launches the supervisor unless it runs, and waits until the monitor
// has written its first status.
func (p *MonitorProcess) Start(ctx context.Context, st State) error {
	f := p.Layout.Instance(st.Name)
	if p.PID(st.Name) != 0 {
		return nil
	}
	if err := os.MkdirAll(f.LogsDir, 0o700); err != nil {
		return err
	}
	os.Remove(f.MonitorStatus)
	cmd, err := launchSupervisor(p.Layout, p.Exe, "monitor", st.Name, f.MonitorDaemon)
	if err != nil {
		return fmt.Errorf("launching the monitor: %w", err)
	}
	go cmd.Wait()
	deadline := time.Now().Add(monitorReadyWithin)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(f.MonitorStatus); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("the monitor wrote no status within %s; see %s", monitorReadyWithin, f.MonitorDaemon)
}

// Stop ends the supervisor and its monitor.
func (p *MonitorProcess) Stop(ctx context.Context, name string) error {
	pid := p.PID(name)
	if pid == 0 {
		return nil
	}
	return stopSupervisor(ctx, pid, p.Layout.Instance(name).MonitorPID)
}

// PID is the supervisor's pid if it is alive and is this instance's.
func (p *MonitorProcess) PID(name string) int {
	return supervisorPID(p.Layout.Instance(name).MonitorPID, "monitor", name)
}

// SuperviseMonitor is the body of `abox monitor supervise NAME`.
func SuperviseMonitor(ctx context.Context, l paths.Layout, exe, name string, log io.Writer) error {
	f := l.Instance(name)
	if err := os.MkdirAll(f.RunDir, 0o700); err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(f.MonitorPID, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(f.MonitorPID)
	return supervise.Run(ctx, supervise.Config{
		Argv: []string{exe, "monitor", "run", name},
		Env:  append(os.Environ(), paths.EnvHome+"="+l.Root),
		Log:  log, What: "monitor",
	})
}

// RunMonitor is the body of `abox monitor run NAME`: it reads the guest's
// channel into logs/monitor.log (rotated) and run/monitor.json until ctx
// ends.
func RunMonitor(ctx context.Context, l paths.Layout, name string, diag io.Writer) error {
	st, err := Load(l, name)
	if err != nil {
		return err
	}
	if !st.Monitor {
		return fmt.Errorf("instance %s was created without --monitor", name)
	}
	f := l.Instance(name)
	events := &lumberjack.Logger{Filename: f.MonitorLog, MaxSize: monitorLogMaxMB, MaxBackups: monitorLogBackups}
	defer events.Close()
	m, err := monitor.New(monitor.Config{
		Instance: name, Events: events, StatusPath: f.MonitorStatus,
		Logger: slog.New(slog.NewJSONHandler(diag, nil)),
		Dial: func(ctx context.Context) (io.ReadCloser, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", f.MonitorSocket)
		},
	})
	if err != nil {
		return err
	}
	return m.Run(ctx)
}
