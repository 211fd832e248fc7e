package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/steps"
	"github.com/abox-dev/abox/internal/validate"
)

// DaemonControl starts and stops an instance's filter daemon.
type DaemonControl interface {
	// Start launches the daemon (supervised: restarted if it dies) and
	// returns once its DNS filter, proxy and API answer.
	Start(ctx context.Context, st State) error
	// Stop ends the daemon and its supervisor; stopping a stopped daemon is not an error.
	Stop(ctx context.Context, name string) error
	// PID returns the supervisor's pid, 0 when not running.
	PID(name string) int
	// Filters reports the filters' readiness as their API answers it:
	// FiltersUp, FiltersRestarting or FiltersDown.
	Filters(ctx context.Context, name string) string
}

// Readiness of an instance's filters (Info.Filters).
const (
	// FiltersUp: the daemon's API answers and both filters serve.
	FiltersUp = "up"
	// FiltersRestarting: the supervisor holds the sockets but no filter
	// process answers (it is starting, or restarting after a crash); the
	// guest gets no answers meanwhile.
	FiltersRestarting = "restarting"
	// FiltersDown: no supervisor.
	FiltersDown = "down"
)

// Start brings up the network, the host firewall chain and the filter
// daemon, then boots the guest. The order matters: the guest must never run
// before the layers that contain it. On failure what was started is stopped.
func (m *Manager) Start(ctx context.Context, name string) (err error) {
	unlock, err := lockInstance(m.Layout, name)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := Load(m.Layout, name)
	if err != nil {
		return err
	}
	dom := libvirt.DomainName(name)
	state, err := m.Hypervisor.State(ctx, dom)
	if errors.Is(err, libvirt.ErrNotFound) {
		return fmt.Errorf("starting %s: libvirt has no domain %s; recreate the instance (abox remove %s && abox create %s)", name, dom, name, name)
	}
	if err != nil {
		return err
	}
	if state.Active() && m.Daemon.PID(name) != 0 {
		if st.Monitor && m.Monitor != nil && m.Monitor.PID(name) == 0 {
			m.startMonitor(ctx, st)
			return nil
		}
		return fmt.Errorf("starting %s: already running (state %s)", name, state)
	}
	// The network, the packet filter and the domain are (re)defined from
	// the state on every start, so the guest always runs under what this
	// abox builds: an instance created by an older abox, or whose objects
	// were edited with virsh, gets the current definitions. libvirt
	// applies a filter redefinition to a running guest at once; the
	// network's and the domain's take effect at their next start.
	if err := m.redefine(ctx, st); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	if m.Hook != nil {
		if wrote, err := InstallHook(m.Hook.Dir, m.Hook.Exe); err != nil {
			return fmt.Errorf("starting %s: %w", name, err)
		} else if wrote {
			m.progress("starting %s: installed the libvirt hook %s (libvirtd reads hooks when it starts: restart it once if it is already running)", name, filepath.Join(m.Hook.Dir, HookFile))
		}
	}
	if state.Active() {
		// The guest runs but its filters died and stayed down (the guest is
		// cut off meanwhile): bring the layers back without touching it.
		m.progress("starting %s: the guest is running without its filters; restarting them", name)
		if err := m.Firewall.Ensure(ctx, FirewallBridge(st)); err != nil {
			return fmt.Errorf("starting %s: host firewall: %w", name, err)
		}
		if err := m.Daemon.Start(ctx, st); err != nil {
			return fmt.Errorf("starting %s: filter daemon: %w", name, err)
		}
		m.startMonitor(ctx, st)
		return nil
	}
	return m.bootLocked(ctx, st, true, func(ctx context.Context) error {
		m.progress("starting %s: booting the guest (accel %s)", name, st.Accel)
		return m.Hypervisor.StartDomain(ctx, dom)
	})
}

// bootLocked brings up the layers that contain st's guest (the network,
// the host firewall chains, the filter daemon), then runs boot, which
// makes the domain's QEMU run (a fresh boot, or a revert to a snapshot
// with memory), then requires the libvirt hook to have run and makes the
// guest's tap inert outside the bridge. The order is the point: the guest
// never runs before the layers around it. On failure what was started is
// stopped and a running guest powered off (steps with undo, see
// internal/steps). record writes the boot record
// status shows (a fresh boot that WaitReady completes).
func (m *Manager) bootLocked(ctx context.Context, st State, record bool, boot func(context.Context) error) error {
	name, dom := st.Name, libvirt.DomainName(st.Name)
	var booted time.Time
	// The steps' errors say "starting NAME" where they did before: a revert
	// runs these as one of its steps, under its own prefix.
	_, err := m.runSteps(ctx, "", []steps.Step{
		{Name: "start the network", Do: func(ctx context.Context) error {
			m.progress("starting %s: network %s", name, st.Bridge)
			m.progress("starting %s: bridge netfilter (br_netfilter) is on; it sends the frames of every bridge on this host, not only abox's, through iptables (see docs/hostfw.md)", name)
			return m.Hypervisor.StartNetwork(ctx, libvirt.NetworkName(name))
		}, Undo: func(ctx context.Context) error { return m.Hypervisor.DestroyNetwork(ctx, libvirt.NetworkName(name)) }},
		{Name: "host firewall", Do: func(ctx context.Context) error {
			if err := m.Firewall.Ensure(ctx, FirewallBridge(st)); err != nil {
				return fmt.Errorf("starting %s: host firewall: %w", name, err)
			}
			return nil
		}},
		{Name: "filter daemon", Do: func(ctx context.Context) error {
			m.progress("starting %s: filters on %s (dns :53, proxy :%d)", name, st.Gateway, st.ProxyPort)
			if err := m.Daemon.Start(ctx, st); err != nil {
				return fmt.Errorf("starting %s: filter daemon: %w", name, err)
			}
			return nil
		}, Undo: func(ctx context.Context) error { return m.Daemon.Stop(ctx, name) }},
		// A guest that cannot be guarded from its first instruction is
		// powered off again: the undo of its boot.
		{Name: "boot the guest", Do: func(ctx context.Context) error {
			booted = time.Now()
			if err := boot(ctx); err != nil {
				// A start that failed after the domain ran (an RPC cut
				// in flight) leaves nothing running.
				return m.powerOffAfter(ctx, dom, err)
			}
			return nil
		}, Undo: func(ctx context.Context) error { return m.Hypervisor.DestroyDomain(ctx, dom) }},
		{Name: "libvirt hook", Do: func(context.Context) error {
			if m.Hook == nil {
				return nil
			}
			ran, err := hookRanSince(m.Layout, name, booted)
			if err == nil && !ran {
				err = fmt.Errorf("libvirtd did not run abox's hook %s, so nothing stops this guest from being started without its host chains and filters; restart libvirtd once (it reads hooks only when it starts) and start again", filepath.Join(m.Hook.Dir, HookFile))
			}
			if err != nil {
				return fmt.Errorf("starting %s: %w", name, err)
			}
			return nil
		}},
		// The tap exists now: make it inert outside the bridge at once rather
		// than at the guard's first round (frames the bridge never forwards,
		// such as those to link-local group addresses, reach the host's IP
		// stack on the tap itself; see docs/hostfw.md).
		{Name: "the guest's tap", Do: func(ctx context.Context) error {
			if err := m.Firewall.EnsurePort(ctx, hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC}); err != nil {
				return fmt.Errorf("starting %s: the guest's tap: %w", name, err)
			}
			return nil
		}},
		{Name: "access and monitor", Do: func(ctx context.Context) error {
			// Status shows how long this boot took; WaitReady completes the record.
			if record {
				if err := writeBoot(m.Layout, name, Boot{StartedAt: time.Now()}); err != nil {
					m.progress("starting %s: %v (status will not show the boot time)", name, err)
				}
			}
			m.resumeAccess(ctx, name)
			// After the domain: libvirt binds the channel's socket when it starts it.
			m.startMonitor(ctx, st)
			return nil
		}},
	})
	return err
}

// redefine defines st's network, packet filter and domain again (the
// filter before the domain that references it).
func (m *Manager) redefine(ctx context.Context, st State) error {
	p := ParamsOf(m.Layout, st)
	netXML, err := libvirt.NetworkXML(p)
	if err != nil {
		return err
	}
	filterXML, err := libvirt.NWFilterXML(p)
	if err != nil {
		return err
	}
	domXML, _, err := m.domainXML(st)
	if err != nil {
		return err
	}
	if err := m.Hypervisor.DefineNetwork(ctx, netXML); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	if err := m.Hypervisor.DefineNWFilter(ctx, filterXML); err != nil {
		return fmt.Errorf("packet filter: %w", err)
	}
	if err := m.Hypervisor.DefineDomain(ctx, domXML); err != nil {
		return fmt.Errorf("domain: %w", err)
	}
	return nil
}

// resumeAccess brings the recorded forwards back; a forward that cannot
// start does not undo a started instance, it is reported.
func (m *Manager) resumeAccess(ctx context.Context, name string) {
	if m.Access == nil {
		return
	}
	if err := m.Access.Resume(ctx, name); err != nil {
		m.progress("warning: starting %s: forwards: %v", name, err)
	}
}

// startMonitor starts the host-side monitor of a monitored instance. A
// failure is a warning: the instance runs normally without its monitor.
func (m *Manager) startMonitor(ctx context.Context, st State) {
	if !st.Monitor || m.Monitor == nil {
		return
	}
	if err := m.Monitor.Start(ctx, st); err != nil {
		m.progress("warning: %s runs without its monitor: %v (abox start %s retries)", st.Name, err, st.Name)
	}
}

// StopOptions tunes Stop.
type StopOptions struct {
	// Force powers the guest off at once instead of an ACPI shutdown.
	Force bool
	// Timeout bounds the ACPI shutdown; then Stop fails unless Force.
	Timeout time.Duration
}

// Stop shuts the guest down, then stops the filter daemon and the network.
// Every step is attempted and every error reported.
func (m *Manager) Stop(ctx context.Context, name string, o StopOptions) error {
	unlock, err := lockInstance(m.Layout, name)
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := Load(m.Layout, name); err != nil {
		return err
	}
	return m.stopLocked(ctx, name, o)
}

func (m *Manager) stopLocked(ctx context.Context, name string, o StopOptions) error {
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	dom := libvirt.DomainName(name)
	var errs []error
	// Mounts and forwards first: they end in the guest's sshd.
	if m.Access != nil {
		if err := m.Access.Release(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("releasing mounts and forwards: %w", err))
		}
	}
	state, err := m.Hypervisor.State(ctx, dom)
	if err != nil && !errors.Is(err, libvirt.ErrNotFound) {
		errs = append(errs, err)
	}
	if err == nil && state.Active() {
		if o.Force {
			m.progress("stopping %s: powering off", name)
			if err := m.Hypervisor.DestroyDomain(ctx, dom); err != nil {
				errs = append(errs, err)
			}
		} else {
			m.progress("stopping %s: ACPI shutdown (up to %s)", name, o.Timeout)
			if err := m.Hypervisor.ShutdownDomain(ctx, dom); err != nil {
				errs = append(errs, err)
			} else {
				wctx, cancel := context.WithTimeout(ctx, o.Timeout)
				err := m.Hypervisor.WaitShutoff(wctx, dom, 500*time.Millisecond)
				cancel()
				if err != nil {
					// The guest keeps running; leave its filters up so it
					// stays contained, and tell the user how to force it.
					return fmt.Errorf("stopping %s: the guest did not shut down within %s (use --force to power it off): %w", name, o.Timeout, err)
				}
			}
		}
	}
	if m.Monitor != nil {
		if err := m.Monitor.Stop(ctx, name); err != nil {
			m.progress("warning: stopping the monitor of %s: %v", name, err)
		}
	}
	if err := m.Daemon.Stop(ctx, name); err != nil {
		errs = append(errs, fmt.Errorf("stopping filter daemon: %w", err))
	}
	if err := m.Hypervisor.DestroyNetwork(ctx, libvirt.NetworkName(name)); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	return nil
}

// Remove deletes an instance: libvirt objects, firewall chain and files. A
// running instance is refused unless force, which powers it off first.
// With force, an instance whose state is damaged or missing (a crashed
// create, a hand-edited file) is removed too: every object abox would have
// made for it is named by the instance name alone (the libvirt objects'
// prefix, the bridge derived from the name), so nothing needs the state.
func (m *Manager) Remove(ctx context.Context, name string, force bool) error {
	unlock, err := lockInstance(m.Layout, name)
	missing := errors.Is(err, ErrNotFound)
	if err != nil && !(force && missing) {
		return err
	}
	if unlock != nil {
		defer unlock()
	}
	bridge, _ := validate.BridgeName(name)
	if !missing {
		st, err := Load(m.Layout, name)
		switch {
		case err == nil:
			bridge = st.Bridge
		case !force:
			return err
		default:
			m.progress("removing %s: %v; removing what abox would have made for it", name, err)
		}
	}
	dom := libvirt.DomainName(name)
	state, err := m.Hypervisor.State(ctx, dom)
	if err != nil && !errors.Is(err, libvirt.ErrNotFound) {
		return err
	}
	if (err == nil && state.Active()) || m.Daemon.PID(name) != 0 {
		if !force {
			return fmt.Errorf("removing %s: it is running; stop it first (abox stop %s) or use --force", name, name)
		}
		if err := m.stopLocked(ctx, name, StopOptions{Force: true}); err != nil {
			return err
		}
	}
	var errs []error
	m.progress("removing %s", name)
	// Without a directory there are no recorded mounts or forwards.
	if m.Access != nil && !missing {
		if err := m.Access.Release(ctx, name); err != nil {
			errs = append(errs, fmt.Errorf("releasing mounts and forwards: %w", err))
		}
	}
	if err := m.Hypervisor.UndefineDomain(ctx, dom); err != nil {
		errs = append(errs, err)
	}
	if err := m.Hypervisor.UndefineNWFilter(ctx, libvirt.FilterName(name)); err != nil {
		errs = append(errs, err)
	}
	if err := m.Hypervisor.DestroyNetwork(ctx, libvirt.NetworkName(name)); err != nil {
		errs = append(errs, err)
	}
	if err := m.Hypervisor.UndefineNetwork(ctx, libvirt.NetworkName(name)); err != nil {
		errs = append(errs, err)
	}
	if err := m.Firewall.Remove(ctx, bridge); err != nil {
		errs = append(errs, fmt.Errorf("host firewall: %w", err))
	}
	// The instance's secret bindings and placeholders go with it: a new
	// instance of the same name must not inherit where its values may go.
	if err := secrets.Open(m.Layout.Secrets()).ForgetInstance(name); err != nil {
		errs = append(errs, fmt.Errorf("secret bindings: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		// Keep the files so that a retry can finish the job.
		return fmt.Errorf("removing %s: %w (files kept; run remove again)", name, err)
	}
	if err := os.RemoveAll(m.Layout.Instance(name).Dir); err != nil {
		return fmt.Errorf("removing %s: %w", name, err)
	}
	if missing {
		return fmt.Errorf("removing %s: %w (removed whatever libvirt objects and chains it had left)", name, ErrNotFound)
	}
	return nil
}

// Info is what list and status show.
type Info struct {
	State
	Status string `json:"status"`
	// DaemonPID is the filter daemon supervisor's pid, 0 when not running.
	DaemonPID int `json:"daemon_pid"`
	// Filters is the filters' readiness from their API (FiltersUp, ...).
	Filters string `json:"filters"`
	// LastBoot is the last start and when the guest became ready.
	LastBoot Boot `json:"last_boot"`
}

// Describe returns the instance with its live status.
func (m *Manager) Describe(ctx context.Context, name string) (Info, error) {
	st, err := Load(m.Layout, name)
	if err != nil {
		return Info{}, err
	}
	return m.describe(ctx, st), nil
}

func (m *Manager) describe(ctx context.Context, st State) Info {
	inf := Info{State: st, Status: "unknown", DaemonPID: m.Daemon.PID(st.Name), Filters: m.Daemon.Filters(ctx, st.Name)}
	// A damaged boot record only loses the figure; status still works.
	inf.LastBoot, _ = LastBoot(m.Layout, st.Name)
	if m.Hypervisor != nil {
		s, err := m.Hypervisor.State(ctx, libvirt.DomainName(st.Name))
		switch {
		case errors.Is(err, libvirt.ErrNotFound):
			inf.Status = "missing"
		case err == nil:
			inf.Status = string(s)
		}
	}
	return inf
}

// List describes every instance.
func (m *Manager) List(ctx context.Context) ([]Info, error) {
	sts, damaged, err := listStates(m.Layout)
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(sts)+len(damaged))
	for _, st := range sts {
		out = append(out, m.describe(ctx, st))
	}
	for name := range damaged {
		out = append(out, Info{State: State{Name: name}, Status: "damaged"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}
