package instance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"libvirt.org/go/libvirtxml"
)

// Guard watches a running instance's host side: its chains (present,
// exactly as built, jumped to first), bridge netfilter and ARP switches,
// and the kernel rules of the nwfilter's binding on the guest's tap, which
// anything on the host can undo (an `iptables -F`, an `ebtables -t nat -F`,
// a firewall reload, libvirt recreating the bridge). Whatever is missing is put back;
// if that fails, the guest's link is taken down, so a guest never runs
// unguarded. It also keeps the serial log bounded whatever virtlogd is
// configured to do. It runs inside the instance's supervisor.
type Guard struct {
	Layout paths.Layout
	Name   string
	// Firewall checks and repairs the chains.
	Firewall interface {
		Check(ctx context.Context, b hostfw.Bridge) (hostfw.Status, error)
		Ensure(ctx context.Context, b hostfw.Bridge) error
		// CheckNWFilter reports the kernel rules of the binding on tap.
		CheckNWFilter(ctx context.Context, tap string) (hostfw.Status, error)
	}
	// Ports checks and repairs the guest's tap: a port of the bridge, and
	// inert should it ever leave it (a network restart leaves it out:
	// see hostfw.Port). nil skips the check.
	Ports interface {
		CheckPort(ctx context.Context, p hostfw.Port) (hostfw.Status, error)
		EnsurePort(ctx context.Context, p hostfw.Port) error
	}
	// Hypervisor names the guest's taps, rebuilds the nwfilter binding on
	// one and takes the link down; nil when libvirtd could not be reached
	// (then the nwfilter's rules are not checked, and a failed repair
	// powers nothing off and is only logged, loudly, every round).
	Hypervisor interface {
		State(ctx context.Context, name string) (libvirt.DomainState, error)
		DomainNICs(ctx context.Context, name string, live bool) ([]libvirt.NIC, error)
		NWFilter(ctx context.Context, name string) (*libvirtxml.NWFilter, error)
		RebindNWFilter(ctx context.Context, portdev string) error
		SetLinkDown(ctx context.Context, domain, network, filter, mac string) error
	}
	Log *slog.Logger
	// Interval between checks; 0 means DefaultGuardInterval.
	Interval time.Duration
	// SerialLogMax is the size in bytes past which the serial log is cut
	// to its last SerialLogKeep bytes (kept in serial.log.1); 0 means
	// DefaultSerialLogMax.
	SerialLogMax int64
	// NWFilterSettle is how long the nwfilter check waits for libvirt's
	// own rebuild before it acts, and the spacing of its retries; 0 means
	// DefaultNWFilterSettle.
	NWFilterSettle time.Duration
}

// Defaults of Guard.
const (
	DefaultGuardInterval  = 2 * time.Second
	DefaultSerialLogMax   = 8 << 20
	DefaultNWFilterSettle = time.Second
	SerialLogKeep         = 1 << 20
)

// Run checks every Interval until ctx ends.
func (g Guard) Run(ctx context.Context) {
	iv := g.Interval
	if iv == 0 {
		iv = DefaultGuardInterval
	}
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		if err := g.Once(ctx); err != nil && ctx.Err() == nil {
			g.Log.Error("guard", "instance", g.Name, "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrLinkDown is returned by Once when it took the guest's link down.
var ErrLinkDown = errors.New("the guest's link is down")

// Once runs one round: chains, then the serial log.
func (g Guard) Once(ctx context.Context) error {
	st, err := Load(g.Layout, g.Name)
	if err != nil {
		return err
	}
	logErr := g.capSerialLog(g.Layout.Instance(g.Name).SerialLog)
	if g.Hypervisor != nil {
		s, err := g.Hypervisor.State(ctx, libvirt.DomainName(g.Name))
		if errors.Is(err, libvirt.ErrNotFound) || err == nil && !s.Active() {
			return logErr // no guest to guard
		}
	}
	b := FirewallBridge(st)
	p := hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC}
	status, err := g.check(ctx, b, p)
	if err == nil && !status.Intact() {
		g.Log.Warn("host firewall damaged; repairing", "instance", g.Name, "problems", status.Problems)
		if err = g.Firewall.Ensure(ctx, b); err == nil && g.Ports != nil {
			err = g.Ports.EnsurePort(ctx, p)
		}
		if err == nil {
			if status, err = g.check(ctx, b, p); err == nil && !status.Intact() {
				err = fmt.Errorf("still damaged after repair: %v", status.Problems)
			}
		}
		if err == nil {
			g.Log.Info("host firewall repaired", "instance", g.Name)
		}
	}
	if err == nil {
		if err = g.nwfilterRules(ctx, st); errors.As(err, new(*uncheckedError)) {
			return errors.Join(logErr, err)
		}
	}
	if err == nil {
		return logErr
	}
	if g.Hypervisor == nil {
		return fmt.Errorf("host firewall of %s cannot be repaired (%w) and libvirtd is out of reach to take the guest's link down", g.Name, err)
	}
	if lerr := g.Hypervisor.SetLinkDown(ctx, libvirt.DomainName(g.Name), libvirt.NetworkName(g.Name), libvirt.FilterName(g.Name), st.MAC); lerr != nil {
		return fmt.Errorf("host firewall of %s cannot be repaired (%w), and taking the link down failed too: %v", g.Name, err, lerr)
	}
	return fmt.Errorf("host firewall of %s cannot be repaired (%v): %w until `abox restart %s`", g.Name, err, ErrLinkDown, g.Name)
}

// nwfilterRules checks the kernel rules of the nwfilter binding on each of
// the running guest's taps and has libvirt rebuild those that are gone.
// An *uncheckedError says it could not look (libvirtd or ebtables busy:
// ebtables-nft fails a listing that races libvirt's own edits), which the
// next round tries again; any other error is a binding still without its
// rules, for which Once takes the link down.
//
// The rules are judged only while the filter libvirt holds is abox's own
// (what libvirt.BuildNWFilter makes of the state): a filter defined
// otherwise through libvirt (doctor reports that) is what the binding's
// rules then follow, and rebuilding the binding would only repeat it.
func (g Guard) nwfilterRules(ctx context.Context, st State) error {
	if g.Hypervisor == nil {
		return nil
	}
	want, err := libvirt.BuildNWFilter(ParamsOf(g.Layout, st))
	if err != nil {
		return err
	}
	def, err := g.Hypervisor.NWFilter(ctx, libvirt.FilterName(g.Name))
	if err != nil {
		return &uncheckedError{fmt.Errorf("reading the nwfilter: %w", err)}
	}
	if !libvirt.SameNWFilterRules(def, want) {
		return nil
	}
	nics, err := g.Hypervisor.DomainNICs(ctx, libvirt.DomainName(g.Name), true)
	if err != nil {
		if errors.Is(err, libvirt.ErrNotFound) {
			return nil // stopped meanwhile
		}
		return &uncheckedError{fmt.Errorf("listing the guest's interfaces: %w", err)}
	}
	settle := g.NWFilterSettle
	if settle == 0 {
		settle = DefaultNWFilterSettle
	}
	for _, n := range nics {
		if n.Target == "" {
			continue
		}
		st, err := g.checkNWFilter(ctx, n.Target, settle)
		if err != nil {
			return err
		}
		if st.Intact() {
			continue
		}
		// libvirt may be rebuilding them itself (a filter redefined, a
		// guest starting): look again before acting.
		if err := sleepCtx(ctx, settle); err != nil {
			return err
		}
		if st, err = g.checkNWFilter(ctx, n.Target, settle); err != nil {
			return err
		}
		if st.Intact() {
			continue
		}
		g.Log.Warn("nwfilter rules gone from the kernel; having libvirt rebuild them", "instance", g.Name, "tap", n.Target, "problems", st.Problems)
		if err := g.Hypervisor.RebindNWFilter(ctx, n.Target); err != nil {
			return err
		}
		for range 4 {
			if st, err = g.checkNWFilter(ctx, n.Target, settle); err != nil || st.Intact() {
				break
			}
			if err := sleepCtx(ctx, settle/2); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		if !st.Intact() {
			return fmt.Errorf("the nwfilter's rules on %s are still missing after libvirt rebuilt the binding: %v", n.Target, st.Problems)
		}
		g.Log.Info("nwfilter rules rebuilt", "instance", g.Name, "tap", n.Target)
	}
	return nil
}

// checkNWFilter is Firewall.CheckNWFilter tried three times: a listing
// that fails says nothing about the rules.
func (g Guard) checkNWFilter(ctx context.Context, tap string, settle time.Duration) (hostfw.Status, error) {
	var err error
	for try := range 3 {
		if try > 0 {
			if err := sleepCtx(ctx, settle/4); err != nil {
				return hostfw.Status{}, err
			}
		}
		var st hostfw.Status
		if st, err = g.Firewall.CheckNWFilter(ctx, tap); err == nil {
			return st, nil
		}
	}
	return hostfw.Status{}, &uncheckedError{fmt.Errorf("checking the nwfilter's rules on %s: %w", tap, err)}
}

// uncheckedError: a guard round could not look at something; it says
// nothing about the layer, so the link stays up and the next round looks
// again.
type uncheckedError struct{ err error }

func (e *uncheckedError) Error() string { return e.err.Error() }
func (e *uncheckedError) Unwrap() error { return e.err }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// check is the chains' and switches' status, and the port's.
func (g Guard) check(ctx context.Context, b hostfw.Bridge, p hostfw.Port) (hostfw.Status, error) {
	status, err := g.Firewall.Check(ctx, b)
	if err != nil || g.Ports == nil {
		return status, err
	}
	ps, err := g.Ports.CheckPort(ctx, p)
	status.Problems = append(status.Problems, ps.Problems...)
	return status, err
}

// capSerialLog keeps the serial log under SerialLogMax: past it, the last
// SerialLogKeep bytes go to serial.log.1 and the log is truncated in
// place (virtlogd or QEMU keep writing to the same open file, in append
// mode, so the next line lands at the new end).
func (g Guard) capSerialLog(path string) error {
	max := g.SerialLogMax
	if max == 0 {
		max = DefaultSerialLogMax
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() <= max {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("capping the serial log: %w", err)
	}
	defer f.Close()
	keep := min(int64(SerialLogKeep), max)
	if _, err := f.Seek(fi.Size()-keep, io.SeekStart); err != nil {
		return fmt.Errorf("capping the serial log: %w", err)
	}
	old, err := os.OpenFile(path+".1", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, PrivateFile)
	if err != nil {
		return fmt.Errorf("capping the serial log: %w", err)
	}
	_, err = io.CopyN(old, f, keep)
	if cerr := old.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("capping the serial log: %w", err)
	}
	if err := os.Truncate(path, 0); err != nil {
		return fmt.Errorf("capping the serial log: %w", err)
	}
	return nil
}
