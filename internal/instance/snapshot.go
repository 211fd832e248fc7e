package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/steps"
	"github.com/abox-dev/abox/internal/validate"
)

// A snapshot holds the guest only: its disk (the instance's qcow2
// overlay, as a qcow2 internal snapshot: the shared base image below is
// never written) and, when it was taken of a running guest, its memory.
// Everything on the host side (the allowlist, filter settings, packet
// filter, host chains, filter daemon, CA, SSH host key pin) is not in it,
// and a revert leaves it as it is now.

// ErrSnapshotNotFound means the instance has no snapshot of that name.
var ErrSnapshotNotFound = errors.New("no such snapshot")

// ErrSnapshotExists means a snapshot of that name exists.
var ErrSnapshotExists = libvirt.ErrSnapshotExists

// SnapshotTimeFormat names a snapshot taken without a name: its UTC time.
const SnapshotTimeFormat = "20060102-150405"

// SnapshotInfo is what snapshot list shows.
type SnapshotInfo struct {
	libvirt.Snapshot
	// MemoryBytes is the size of the guest memory and device state saved
	// with the snapshot (qemu-img's vm-state-size); 0 for a snapshot of a
	// stopped guest, or when qemu-img could not tell.
	MemoryBytes uint64 `json:"memory_bytes"`
}

// CreateSnapshot takes a snapshot of instance name, running or stopped.
// An empty snap names it by the current UTC time (SnapshotTimeFormat).
func (m *Manager) CreateSnapshot(ctx context.Context, name, snap, description string) (libvirt.Snapshot, error) {
	if snap == "" {
		snap = time.Now().UTC().Format(SnapshotTimeFormat)
	}
	if err := validate.SnapshotName(snap); err != nil {
		return libvirt.Snapshot{}, err
	}
	if err := libvirt.SnapshotDescription(description); err != nil {
		return libvirt.Snapshot{}, err
	}
	unlock, err := m.lockWaiting(name)
	if err != nil {
		return libvirt.Snapshot{}, err
	}
	defer unlock()
	if _, err := Load(m.Layout, name); err != nil {
		return libvirt.Snapshot{}, err
	}
	dom := libvirt.DomainName(name)
	state, err := m.domainState(ctx, name, "taking a snapshot of")
	if err != nil {
		return libvirt.Snapshot{}, err
	}
	if state.Active() {
		m.progress("snapshot %s of %s: saving the running guest's memory and disk (the guest is paused meanwhile)", snap, name)
	} else {
		m.progress("snapshot %s of %s: saving the stopped guest's disk", snap, name)
	}
	s, err := m.Hypervisor.CreateSnapshot(ctx, dom, snap, description)
	if errors.Is(err, libvirt.ErrSnapshotExists) {
		return libvirt.Snapshot{}, fmt.Errorf("snapshot %s of %s: %w (pick another name, or remove it first: abox snapshot remove %s %s)", snap, name, ErrSnapshotExists, name, snap)
	}
	if err != nil {
		return libvirt.Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", snap, name, err)
	}
	return s, nil
}

// lockWaiting takes the instance lock, saying so when another command
// (a start, stop, remove or another snapshot command) holds it and this
// one waits for it to finish.
func (m *Manager) lockWaiting(name string) (func(), error) {
	return lockInstanceNotify(m.Layout, name, func() {
		m.progress("%s: another abox command (start, stop, remove, snapshot) is working on it; waiting for it to finish", name)
	})
}

// domainState is the instance's domain state, with the fix in the error
// when libvirt has no domain for it.
func (m *Manager) domainState(ctx context.Context, name, doing string) (libvirt.DomainState, error) {
	dom := libvirt.DomainName(name)
	state, err := m.Hypervisor.State(ctx, dom)
	if errors.Is(err, libvirt.ErrNotFound) {
		return state, fmt.Errorf("%s %s: libvirt has no domain %s; recreate the instance (abox remove %s && abox create %s)", doing, name, dom, name, name)
	}
	return state, err
}

// Snapshots lists instance name's snapshots, oldest first.
func (m *Manager) Snapshots(ctx context.Context, name string) ([]SnapshotInfo, error) {
	if _, err := Load(m.Layout, name); err != nil {
		return nil, err
	}
	if _, err := m.domainState(ctx, name, "listing the snapshots of"); err != nil {
		return nil, err
	}
	list, err := m.Hypervisor.Snapshots(ctx, libvirt.DomainName(name))
	if err != nil {
		return nil, err
	}
	sizes := m.snapshotSizes(ctx, name)
	out := make([]SnapshotInfo, 0, len(list))
	for _, s := range list {
		out = append(out, SnapshotInfo{Snapshot: s, MemoryBytes: sizes[s.Name]})
	}
	return out, nil
}

// snapshotSizes reads the saved memory sizes from the overlay's qcow2
// snapshot table. -U (--force-share) reads it while QEMU holds the image;
// a failure only loses the figures. The guest's QEMU can write the
// overlay: its format is named, never probed (a vmdk descriptor would make
// qemu-img open the host paths it lists), and the read is bounded in time.
func (m *Manager) snapshotSizes(ctx context.Context, name string) map[string]uint64 {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := m.Run.Run(ctx, "qemu-img", "info", "-U", "-f", "qcow2", "--output=json", m.Layout.Instance(name).Disk)
	if err != nil {
		return nil
	}
	var info struct {
		Snapshots []struct {
			Name        string `json:"name"`
			VMStateSize uint64 `json:"vm-state-size"`
		} `json:"snapshots"`
	}
	if json.Unmarshal(out, &info) != nil {
		return nil
	}
	sizes := map[string]uint64{}
	for _, s := range info.Snapshots {
		sizes[s.Name] = s.VMStateSize
	}
	return sizes
}

// RevertResult says what a revert did to the guest.
type RevertResult struct {
	Snapshot libvirt.Snapshot
	// Before and After are the domain's states around the revert.
	Before, After libvirt.DomainState
}

// RevertSnapshot puts instance name's guest back to snapshot snap.
//
//   - A snapshot of a running guest: the guest runs on from that moment,
//     its memory and disk as they were (a running guest is replaced in
//     place; a stopped instance is started first, layers before guest, as
//     start does).
//   - A snapshot of a stopped guest: the disk is put back and the instance
//     is stopped (a running guest is powered off, losing what it had not
//     written; its filters and network are then stopped as stop does).
//
// Either way the host side stays as it is now: the network, packet filter
// and domain are defined again from the instance's state, the host chains
// are ensured. A memory snapshot whose definition (the one it keeps, then
// the one libvirt runs, the guest still paused) fails libvirt.CheckDevices
// is refused before the guest runs, and a guest already running is
// powered off.
func (m *Manager) RevertSnapshot(ctx context.Context, name, snap string) (RevertResult, error) {
	if err := validate.SnapshotName(snap); err != nil {
		return RevertResult{}, err
	}
	unlock, err := m.lockWaiting(name)
	if err != nil {
		return RevertResult{}, err
	}
	defer unlock()
	st, err := Load(m.Layout, name)
	if err != nil {
		return RevertResult{}, err
	}
	before, err := m.domainState(ctx, name, "reverting")
	if err != nil {
		return RevertResult{}, err
	}
	target, err := m.findSnapshot(ctx, name, snap)
	if err != nil {
		return RevertResult{}, err
	}
	res := RevertResult{Snapshot: target, Before: before}
	_, err = m.runSteps(ctx, fmt.Sprintf("reverting %s to snapshot %s", name, snap), m.revertSteps(st, &res))
	if se := (*steps.Error)(nil); errors.As(err, &se) && slices.Contains(se.Undone, stepReplaceGuest) {
		err = fmt.Errorf("%w (the guest was powered off)", err)
	}
	if err == nil {
		m.recordAudit(name, AuditRevert, map[string]any{"snapshot": snap, "created": target.Created, "memory": target.Memory()})
	}
	return res, err
}

// stepReplaceGuest is the revert step whose undo powers the guest off.
const stepReplaceGuest = "replace the running guest"

// revertSteps are RevertSnapshot's steps for st from res.Before to
// res.Snapshot; the last fills in res.After.
func (m *Manager) revertSteps(st State, res *RevertResult) []steps.Step {
	name, dom, target := st.Name, libvirt.DomainName(st.Name), res.Snapshot
	snap, at := target.Name, target.Created.Format(time.RFC3339)
	// The definitions a memory snapshot brings back are checked before
	// its guest runs: the one it keeps before anything is reverted, the
	// one libvirt runs while the guest is still paused. A guest that was
	// not reverted as asked, or whose containment could not be checked,
	// does not run on.
	check := func(def string) error { return m.checkRevertedDevices(st, def) }
	revert := func(ctx context.Context) error {
		if err := m.Hypervisor.RevertSnapshot(ctx, dom, snap, check); err != nil {
			return m.powerOffAfter(ctx, dom, err)
		}
		return nil
	}
	list := []steps.Step{
		// The host side now, not as it was: the filter libvirt applies to the
		// guest's port is the current one before any guest state comes back.
		{Name: "redefine the host side", Do: func(ctx context.Context) error { return m.redefine(ctx, st) }},
		{Name: "release guest access", Do: func(ctx context.Context) error {
			if res.Before.Active() && m.Access != nil {
				// Mounts and forwards end in the guest's sshd, whose sessions the
				// revert ends.
				if err := m.Access.Release(ctx, name); err != nil {
					m.progress("warning: reverting %s: releasing mounts and forwards: %v", name, err)
				}
			}
			return nil
		}},
	}
	switch {
	case target.Memory() && !res.Before.Active():
		list = append(list, steps.Step{Name: "start the layers and resume the guest", Do: func(ctx context.Context) error {
			m.progress("reverting %s to %s: starting the instance's filters and network, then resuming the guest as it was at %s", name, snap, at)
			return m.bootLocked(ctx, st, false, revert)
		}})
	case target.Memory():
		list = append(list,
			steps.Step{Name: stepReplaceGuest, Do: func(ctx context.Context) error {
				m.progress("reverting %s to %s: the running guest is replaced by the one saved at %s (its processes, memory and disk as they were then; SSH sessions end)", name, snap, at)
				return revert(ctx)
			}, Undo: func(ctx context.Context) error {
				// The host chains around it could not be ensured: it does not run on.
				if s, err := m.Hypervisor.State(ctx, dom); err == nil && !s.Active() {
					return nil
				}
				return m.Hypervisor.DestroyDomain(ctx, dom)
			}},
			steps.Step{Name: "host firewall", Do: func(ctx context.Context) error {
				if err := m.Firewall.Ensure(ctx, FirewallBridge(st)); err != nil {
					return fmt.Errorf("host firewall: %w", err)
				}
				return nil
			}},
			steps.Step{Name: "the guest's tap", Do: func(ctx context.Context) error {
				if err := m.Firewall.EnsurePort(ctx, hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC}); err != nil {
					return fmt.Errorf("the guest's tap: %w", err)
				}
				m.resumeAccess(ctx, name)
				return nil
			}})
	case res.Before.Active():
		list = append(list,
			steps.Step{Name: "power off and revert the disk", Do: func(ctx context.Context) error {
				m.progress("reverting %s to %s: powering the running guest off (it is not shut down: what it had not written is lost), then putting its disk back as it was at %s", name, snap, at)
				return revert(ctx)
			}},
			// The guest is off: take its layers down as stop does.
			steps.Step{Name: "stop the layers", Do: func(ctx context.Context) error {
				return m.stopLocked(ctx, name, StopOptions{Force: true})
			}})
	default:
		list = append(list, steps.Step{Name: "revert the disk", Do: func(ctx context.Context) error {
			m.progress("reverting %s to %s: putting the stopped guest's disk back as it was at %s", name, snap, at)
			return revert(ctx)
		}})
	}
	return append(list,
		// libvirt took the persistent definition from the snapshot: put the
		// current one back, so the next start runs what this abox builds.
		steps.Step{Name: "redefine the current definition", Do: func(ctx context.Context) error { return m.redefine(ctx, st) }},
		steps.Step{Name: "set the guest's clock", Do: func(ctx context.Context) error {
			if target.Memory() {
				m.setGuestClock(ctx, st, target)
			}
			return nil
		}},
		steps.Step{Name: "read the domain state", Do: func(ctx context.Context) (err error) {
			res.After, err = m.Hypervisor.State(ctx, dom)
			return err
		}})
}

// checkRevertedDevices holds a definition a revert brings back (its XML)
// to the allow list, the instance's filtered NIC and the devices of the
// one this abox builds from st (libvirt.CheckDevices).
func (m *Manager) checkRevertedDevices(st State, def string) error {
	x, _, err := m.domainXML(st)
	if err != nil {
		return err
	}
	var want libvirtxml.Domain
	if err := want.Unmarshal(x); err != nil {
		return err
	}
	return libvirt.CheckDevices(def, ParamsOf(m.Layout, st), &want)
}

// setGuestClock sets a guest resumed from a snapshot to the host's time.
// Its clock resumes where the snapshot stopped it, as far behind as the
// snapshot is old, and no time service reaches it through the filters:
// TLS through the proxy fails on certificates the guest thinks are not
// yet valid (a leaf is valid from 5 minutes before it is minted), and
// build tools see files from the future. Best effort over the instance's
// own SSH: a guest that does not let it gets a warning with the command.
func (m *Manager) setGuestClock(ctx context.Context, st State, from libvirt.Snapshot) {
	warn := func(err error) {
		m.progress("warning: reverting %s: setting the guest's clock: %v; it runs about %s behind until `abox ssh %s -- sudo date -u -s @$(date +%%s)`",
			st.Name, err, time.Since(from.Created).Round(time.Second), st.Name)
	}
	cmd := fmt.Sprintf("sudo -n date -u -s @%d >/dev/null", time.Now().Unix())
	args, err := SSHArgs(m.Layout, st, []string{cmd})
	if err != nil {
		warn(err)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if out, err := m.Run.Run(sctx, "ssh", args...); err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 200 { // the guest's words: a line is enough
			msg = msg[:200]
		}
		warn(fmt.Errorf("%w: %s", err, printable(msg)))
	}
}

// powerOffAfter powers the guest off when err left it running: a guest
// that was not reverted as asked, or whose containment could not be
// checked, does not run on.
func (m *Manager) powerOffAfter(ctx context.Context, dom string, err error) error {
	ctx = context.WithoutCancel(ctx)
	if st, serr := m.Hypervisor.State(ctx, dom); serr == nil && !st.Active() {
		return err
	}
	if derr := m.Hypervisor.DestroyDomain(ctx, dom); derr != nil {
		return fmt.Errorf("%w (and powering the guest off: %v)", err, derr)
	}
	return fmt.Errorf("%w (the guest was powered off)", err)
}

func (m *Manager) findSnapshot(ctx context.Context, name, snap string) (libvirt.Snapshot, error) {
	list, err := m.Hypervisor.Snapshots(ctx, libvirt.DomainName(name))
	if err != nil {
		return libvirt.Snapshot{}, err
	}
	for _, s := range list {
		if s.Name == snap {
			return s, nil
		}
	}
	return libvirt.Snapshot{}, fmt.Errorf("instance %s: %w %s", name, ErrSnapshotNotFound, snap)
}

// RemoveSnapshots deletes snapshots of instance name: the ones named, or
// every one when all. Snapshots taken on top of a removed one stay.
func (m *Manager) RemoveSnapshots(ctx context.Context, name string, snaps []string, all bool) ([]string, error) {
	for _, s := range snaps {
		if err := validate.SnapshotName(s); err != nil {
			return nil, err
		}
	}
	unlock, err := m.lockWaiting(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if _, err := Load(m.Layout, name); err != nil {
		return nil, err
	}
	if _, err := m.domainState(ctx, name, "removing snapshots of"); err != nil {
		return nil, err
	}
	if all {
		list, err := m.Hypervisor.Snapshots(ctx, libvirt.DomainName(name))
		if err != nil {
			return nil, err
		}
		snaps = nil
		// Newest first: a child goes before its parent, so libvirt need
		// not re-parent anything.
		for i := len(list) - 1; i >= 0; i-- {
			snaps = append(snaps, list[i].Name)
		}
	} else {
		// Every name must exist before any is removed.
		for _, s := range snaps {
			if _, err := m.findSnapshot(ctx, name, s); err != nil {
				return nil, err
			}
		}
	}
	var removed []string
	for _, s := range snaps {
		if err := m.Hypervisor.DeleteSnapshot(ctx, libvirt.DomainName(name), s); err != nil {
			return removed, fmt.Errorf("removing snapshot %s of %s: %w", s, name, err)
		}
		removed = append(removed, s)
	}
	return removed, nil
}
