package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

func newMonitorCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "monitor",
		Short: "The runtime monitor of instances created with --monitor (Tetragon events from the guest)",
	}
	cmd.AddCommand(newMonitorStatusCmd(e), newMonitorLogsCmd(e), newMonitorAgentCmd(e), newMonitorRunCmd(e), newMonitorSuperviseCmd(e))
	return cmd
}

// startMonitorAgent sets up the guest side of a monitored instance that is
// ready; a failure is a warning, the monitor never holds the instance back.
func (e *env) startMonitorAgent(ctx context.Context, l paths.Layout, name string) {
	t, err := guest.Load(l, name)
	if err == nil {
		err = guest.StartMonitorAgent(ctx, t, e.stderr)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "warning: %v (abox monitor agent %s retries)\n", err, name)
	}
}

// monitorAgentInBackground runs `abox monitor agent NAME` detached, for a
// start that does not wait: it waits for the guest itself and then sets up
// its side (logs/monitor-agent.log).
func (e *env) monitorAgentInBackground(m *instance.Manager, name string, timeout time.Duration) {
	st, err := instance.Load(m.Layout, name)
	if err != nil || !st.Monitor {
		return
	}
	exe, err := executable()
	if err == nil {
		err = instance.Detach(m.Layout, m.Layout.Instance(name).MonitorAgentLog, exe, "monitor", "agent", name, "--timeout", timeout.String())
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "warning: the monitor's guest side will not start by itself: %v (run abox monitor agent %s once the guest is up)\n", err, name)
		return
	}
	fmt.Fprintf(e.stderr, "the monitor's guest side starts once %s is up (see %s)\n", name, m.Layout.Instance(name).MonitorAgentLog)
}

func newMonitorAgentCmd(e *env) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "agent NAME",
		Short: "Wait for the guest, then start its side of the monitor (the forwarder, and Tetragon from the instance's bundle, installing it if needed)",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, st, err := e.monitored(args[0])
			if err != nil {
				return err
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			if _, err := m.WaitReady(cmd.Context(), st.Name, timeout); err != nil {
				return err
			}
			t, err := guest.Load(m.Layout, st.Name)
			if err != nil {
				return err
			}
			if err := guest.StartMonitorAgent(cmd.Context(), t, e.stderr); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "the monitor's guest side runs in %s\n", st.Name)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", instance.DefaultReadyTimeout, "how long to wait for the guest")
	return cmd
}

// monitored loads an instance and refuses one without the monitor.
func (e *env) monitored(name string) (paths.Layout, instance.State, error) {
	if err := validate.InstanceName(name); err != nil {
		return paths.Layout{}, instance.State{}, usageError{err}
	}
	l, err := e.layout()
	if err != nil {
		return l, instance.State{}, err
	}
	st, err := instance.Load(l, name)
	if err != nil {
		return l, st, notFoundHint(name, err)
	}
	if !st.Monitor {
		return l, st, withHint(fmt.Errorf("instance %s has no monitor", name),
			fmt.Sprintf("create the instance with --monitor (abox remove %s && abox create %s --monitor ...)", name, name))
	}
	return l, st, nil
}

// MonitorStatus is the body of `abox monitor status --json`.
type MonitorStatus struct {
	Instance string `json:"instance"`
	// Running: the monitor process is alive.
	Running bool `json:"running"`
	// AgentSilent: no heartbeat from the guest forwarder within
	// SilentAfter; SilentSince is its last heartbeat (or the monitor's
	// start when there never was one).
	AgentSilent bool           `json:"agent_silent"`
	SilentSince time.Time      `json:"silent_since,omitzero"`
	Monitor     monitor.Status `json:"monitor"`
	// Bundle is the Tetragon bundle abox installs in the guest, or nil.
	Bundle *instance.MonitorBundle `json:"bundle,omitempty"`
	// Setup is the guest side's last setup (forwarder, Tetragon).
	Setup guest.AgentSetup `json:"setup"`
}

func newMonitorStatusCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show whether the monitor and the guest agent are alive, the last event, rates and drops",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, st, err := e.monitored(args[0])
			if err != nil {
				return err
			}
			f := l.Instance(st.Name)
			proc := &instance.MonitorProcess{Layout: l}
			out := MonitorStatus{Instance: st.Name, Running: proc.PID(st.Name) != 0}
			ms, err := monitor.ReadStatus(f.MonitorStatus)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			out.Monitor = ms
			out.Bundle = st.MonitorBundle
			if out.Setup, err = guest.ReadAgentSetup(f.MonitorAgent); err != nil {
				return err
			}
			now := time.Now()
			if out.Running {
				out.AgentSilent, out.SilentSince = ms.Silent(now)
			}
			if asJSON {
				return writeJSON(e.stdout, out)
			}
			renderMonitorStatus(e.stdout, out, now)
			return nil
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func renderMonitorStatus(w io.Writer, s MonitorStatus, now time.Time) {
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.DateTime), now.Sub(t).Round(time.Second))
	}
	m := s.Monitor
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "instance:\t%s\n", s.Instance)
	if !s.Running {
		fmt.Fprintf(tw, "monitor:\tnot running (abox start %s starts it)\n", s.Instance)
	} else {
		fmt.Fprintf(tw, "monitor:\trunning (pid %d, since %s)\n", m.PID, m.Started.Local().Format(time.DateTime))
		ch := "connected"
		if !m.Connected {
			ch = "not connected (is the guest running?)"
		}
		fmt.Fprintf(tw, "channel:\t%s\n", ch)
		switch {
		case s.AgentSilent:
			fmt.Fprintf(tw, "guest agent:\tsilent since %s\n", ago(s.SilentSince))
		default:
			agent := monitor.Printable(m.Agent)
			state := "not running in the guest (the forwarder is alive)"
			if m.AgentUp {
				state = "running"
			}
			fmt.Fprintf(tw, "guest agent:\t%s %s, last heartbeat %s\n", agent, state, ago(m.LastHeartbeat))
		}
	}
	if b := s.Bundle; b != nil {
		fmt.Fprintf(tw, "tetragon bundle:\tsha256 %s (%s, %d BPF objects)\n", b.SHA256, monitor.Printable(b.Source), b.BPFObjects)
	} else {
		fmt.Fprintf(tw, "tetragon bundle:\tnone (abox installs no agent; a Tetragon of the guest's own that writes %s is read)\n", cloudinit.MonitorExport)
	}
	switch u := s.Setup; {
	case u.At.IsZero():
		fmt.Fprintf(tw, "guest setup:\tnot done yet (abox start or abox monitor agent %s does it once the guest is up)\n", s.Instance)
	case u.Error != "":
		fmt.Fprintf(tw, "guest setup:\tfailed %s: %s\n", ago(u.At), monitor.Printable(u.Error))
	case u.Installed:
		fmt.Fprintf(tw, "guest setup:\ttetragon installed and started %s, took %s\n", ago(u.At), (time.Duration(u.TookMS) * time.Millisecond).Round(100*time.Millisecond))
	default:
		fmt.Fprintf(tw, "guest setup:\tstarted %s, took %s\n", ago(u.At), (time.Duration(u.TookMS) * time.Millisecond).Round(100*time.Millisecond))
	}
	fmt.Fprintf(tw, "last event:\t%s\n", ago(m.LastEvent))
	var types []string
	for _, t := range monitor.Types {
		if n := m.ByType[t]; n > 0 {
			types = append(types, fmt.Sprintf("%s %d", t, n))
		}
	}
	fmt.Fprintf(tw, "events:\t%d (%s), %.1f/s\n", m.Events, strings.Join(types, ", "), m.EventsPerSec)
	fmt.Fprintf(tw, "dropped:\t%d (oversize %d, rate %d, invalid %d)\n", m.Dropped(), m.DroppedOversize, m.DroppedRate, m.DroppedInvalid)
	fmt.Fprintf(tw, "bytes:\t%d\n", m.Bytes)
	tw.Flush()
}

func newMonitorLogsCmd(e *env) *cobra.Command {
	var n int
	var follow, asJSON bool
	var typ string
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: "Print the guest's monitor events (exec, file, net)",
		Long: `Print the normalised events of logs/monitor.log: one line each, or the JSON
lines with --json. Every field comes from the guest and is shown with control
characters replaced, so no event can rewrite the terminal.`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if typ != "" && !slices.Contains(monitor.Types, typ) {
				return usageError{fmt.Errorf("--type %q: want one of %s", typ, strings.Join(monitor.Types, ", "))}
			}
			if n < 0 {
				return usageError{fmt.Errorf("-n %d: want 0 or more", n)}
			}
			l, st, err := e.monitored(args[0])
			if err != nil {
				return err
			}
			path := l.Instance(st.Name).MonitorLog
			print := func(line []byte) {
				var ev monitor.Event
				if json.Unmarshal(line, &ev) != nil || (typ != "" && ev.Type != typ) {
					return
				}
				if asJSON {
					// Re-encoded, not echoed: the output is exactly the
					// event abox understood.
					b, _ := json.Marshal(ev)
					fmt.Fprintf(e.stdout, "%s\n", b)
					return
				}
				fmt.Fprintln(e.stdout, ev.Line())
			}
			return followLog(cmd.Context(), path, n, follow, typ, print)
		},
	}
	cmd.Flags().IntVarP(&n, "lines", "n", 100, "number of recent events")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new events")
	cmd.Flags().StringVar(&typ, "type", "", "only events of this type: "+strings.Join(monitor.Types, ", "))
	jsonFlag(cmd.Flags(), &asJSON, "print JSON lines")
	return cmd
}

// followLog prints the last n matching lines of path and, with follow,
// every line appended later, reopening the file when it is rotated.
func followLog(ctx context.Context, path string, n int, follow bool, typ string, print func([]byte)) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) && follow {
		f = nil
	} else if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	var pos int64
	if f != nil {
		lines, end, err := lastLines(f, n, typ)
		if err != nil {
			f.Close()
			return err
		}
		for _, l := range lines {
			print(l)
		}
		pos = end
	}
	if !follow {
		if f != nil {
			f.Close()
		}
		return nil
	}
	var partial []byte
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if f != nil {
				f.Close()
			}
			return nil
		case <-t.C:
		}
		if f == nil {
			if f, err = os.Open(path); err != nil {
				f = nil
				continue
			}
			pos, partial = 0, nil
		}
		// Rotated (a new file at path) or truncated: start over on it.
		if cur, err := os.Stat(path); err == nil {
			if old, err := f.Stat(); err == nil && (!os.SameFile(cur, old) || old.Size() < pos) {
				f.Close()
				f = nil
				continue
			}
		}
		if _, err := f.Seek(pos, io.SeekStart); err != nil {
			return err
		}
		br := bufio.NewReaderSize(f, 1<<16)
		for {
			b, err := br.ReadBytes('\n')
			pos += int64(len(b))
			if err != nil {
				partial = append(partial, b...)
				break
			}
			print(append(partial, b...))
			partial = nil
		}
	}
}

// lastLines returns the last n lines of f (of type typ, if set) and the
// offset of its end. The log is bounded by rotation, so reading it whole
// is bounded too.
func lastLines(f *os.File, n int, typ string) ([][]byte, int64, error) {
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, 0, err
	}
	end := int64(len(data))
	if i := strings.LastIndexByte(string(data), '\n'); i >= 0 {
		data = data[:i+1]
		end = int64(i + 1)
	} else {
		return nil, 0, nil
	}
	var out [][]byte
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if l == "" {
			continue
		}
		if typ != "" && !strings.Contains(l, `"type":"`+typ+`"`) {
			continue
		}
		out = append(out, []byte(l))
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out, end, nil
}

func newMonitorRunCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:    "run NAME",
		Short:  "Run an instance's host-side monitor (used by abox start)",
		Hidden: true,
		Args:   exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			return instance.RunMonitor(cmd.Context(), l, args[0], e.stderr)
		},
	}
}

func newMonitorSuperviseCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:    "supervise NAME",
		Short:  "Keep an instance's monitor running (used by abox start)",
		Hidden: true,
		Args:   exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			exe, err := executable()
			if err != nil {
				return err
			}
			return instance.SuperviseMonitor(cmd.Context(), l, exe, args[0], e.stderr)
		},
	}
}
