package libvirt

import (
	"context"
	"errors"
	"fmt"
	"sort"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

func (c *Client) snapshot(ctx context.Context, d golibvirt.Domain, name string) (golibvirt.DomainSnapshot, error) {
	s, err := call(ctx, func() (golibvirt.DomainSnapshot, error) { return c.r.DomainSnapshotLookupByName(d, name, 0) })
	if hasCode(err, golibvirt.ErrNoDomainSnapshot) {
		return s, fmt.Errorf("%w: domain %s has no snapshot %s", ErrNotFound, d.Name, name)
	}
	return s, err
}

// Domain returns a domain's definition as libvirt runs it now (the live
// one when active, else the persistent one).
func (c *Client) Domain(ctx context.Context, name string) (*libvirtxml.Domain, error) {
	d, _, err := c.domain(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("reading domain %s: %w", name, err)
	}
	doc, err := call(ctx, func() (string, error) { return c.r.DomainGetXMLDesc(d, 0) })
	if err != nil {
		return nil, fmt.Errorf("reading domain %s: %w", name, notFound(err))
	}
	var x libvirtxml.Domain
	if err := x.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("reading domain %s: %w", name, err)
	}
	return &x, nil
}

// CreateSnapshot takes snapshot name of a domain (see SnapshotXML): with
// the guest's memory when it is active, of its disks when it is not. The
// guest is paused while QEMU writes its memory into the overlay. libvirt
// creates it atomically; a snapshot libvirt still recorded after an error
// is deleted again, so a failed create leaves nothing.
func (c *Client) CreateSnapshot(ctx context.Context, domain, name, description string) (Snapshot, error) {
	fail := func(err error) (Snapshot, error) {
		return Snapshot{}, fmt.Errorf("taking snapshot %s of %s: %w", name, domain, err)
	}
	d, st, err := c.domain(ctx, domain)
	if err != nil {
		return fail(err)
	}
	if _, err := c.snapshot(ctx, d, name); err == nil {
		return fail(ErrSnapshotExists)
	} else if !errors.Is(err, ErrNotFound) {
		return fail(err)
	}
	def, err := c.Domain(ctx, domain)
	if err != nil {
		return fail(err)
	}
	doc, err := SnapshotXML(name, description, st.Active(), def)
	if err != nil {
		return Snapshot{}, err
	}
	flags := uint32(golibvirt.DomainSnapshotCreateAtomic | golibvirt.DomainSnapshotCreateValidate)
	s, err := call(ctx, func() (golibvirt.DomainSnapshot, error) { return c.r.DomainSnapshotCreateXML(d, doc, flags) })
	if err != nil {
		// An abandoned call (ctx ended) may still complete: look again
		// without ctx, and undo what libvirt recorded.
		bg := context.WithoutCancel(ctx)
		if left, lerr := c.snapshot(bg, d, name); lerr == nil {
			if derr := do(bg, func() error { return c.r.DomainSnapshotDelete(left, 0) }); derr != nil {
				err = fmt.Errorf("%w (and deleting what was made: %v)", err, derr)
			}
		}
		if hasCode(err, golibvirt.ErrOperationUnsupported) || hasCode(err, golibvirt.ErrConfigUnsupported) || hasCode(err, golibvirt.ErrOperationInvalid) {
			return fail(fmt.Errorf("libvirt refused: %w", err))
		}
		return fail(err)
	}
	return c.describeSnapshot(ctx, d, s)
}

func (c *Client) describeSnapshot(ctx context.Context, d golibvirt.Domain, s golibvirt.DomainSnapshot) (Snapshot, error) {
	doc, err := call(ctx, func() (string, error) { return c.r.DomainSnapshotGetXMLDesc(s, 0) })
	if err != nil {
		return Snapshot{}, fmt.Errorf("reading snapshot %s of %s: %w", s.Name, d.Name, err)
	}
	info, err := parseSnapshot(doc)
	if err != nil {
		return Snapshot{}, fmt.Errorf("reading snapshot %s of %s: %w", s.Name, d.Name, err)
	}
	cur, err := call(ctx, func() (int32, error) { return c.r.DomainSnapshotIsCurrent(s, 0) })
	if err != nil {
		return Snapshot{}, fmt.Errorf("reading snapshot %s of %s: %w", s.Name, d.Name, err)
	}
	info.Current = cur == 1
	return info, nil
}

// Snapshots lists a domain's snapshots, oldest first.
func (c *Client) Snapshots(ctx context.Context, domain string) ([]Snapshot, error) {
	d, _, err := c.domain(ctx, domain)
	if err != nil {
		return nil, fmt.Errorf("listing snapshots of %s: %w", domain, err)
	}
	all, err := call(ctx, func() ([]golibvirt.DomainSnapshot, error) {
		s, _, err := c.r.DomainListAllSnapshots(d, 1, 0)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing snapshots of %s: %w", domain, notFound(err))
	}
	var res []Snapshot
	for _, s := range all {
		info, err := c.describeSnapshot(ctx, d, s)
		if hasCode(err, golibvirt.ErrNoDomainSnapshot) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("listing snapshots: %w", err)
		}
		res = append(res, info)
	}
	sort.SliceStable(res, func(i, j int) bool {
		if !res[i].Created.Equal(res[j].Created) {
			return res[i].Created.Before(res[j].Created)
		}
		return res[i].Name < res[j].Name
	})
	return res, nil
}

// RevertSnapshot puts a domain back to snapshot name: its disks, and for a
// snapshot of an active domain its memory, so the guest runs on from that
// moment (starting QEMU if the domain was off); reverting to a snapshot of
// a stopped domain powers a running guest off. libvirt also takes the
// domain's definition from the snapshot: callers define the current one
// again.
//
// For a snapshot with memory, check judges the definitions the guest
// comes back with before any of the guest runs: the ones the snapshot
// keeps, read before anything is reverted (a refusal reverts nothing),
// then the one libvirt runs, read after a revert that leaves the guest's
// vCPUs paused (VIR_DOMAIN_SNAPSHOT_REVERT_PAUSED). Only when both pass
// is the guest resumed (if it was running when the snapshot was taken); a
// refusal after the revert leaves it paused, for the caller to power off.
func (c *Client) RevertSnapshot(ctx context.Context, domain, name string, check func(domainXML string) error) error {
	fail := func(err error) error {
		return fmt.Errorf("reverting %s to snapshot %s: %w", domain, name, err)
	}
	if check == nil {
		return fail(errors.New("no check of the definition it brings back"))
	}
	d, _, err := c.domain(ctx, domain)
	if err != nil {
		return fail(err)
	}
	s, err := c.snapshot(ctx, d, name)
	if err != nil {
		return fail(err)
	}
	doc, err := call(ctx, func() (string, error) { return c.r.DomainSnapshotGetXMLDesc(s, 0) })
	if err != nil {
		return fail(err)
	}
	info, err := parseSnapshot(doc)
	if err != nil {
		return fail(err)
	}
	var flags uint32
	if info.Memory() {
		defs, err := snapshotDefinitions(doc)
		if err != nil {
			return fail(err)
		}
		if len(defs) == 0 {
			return fail(errors.New("the snapshot keeps no definition to check"))
		}
		for _, def := range defs {
			if err := check(def); err != nil {
				return fail(fmt.Errorf("refused before reverting anything: %w", err))
			}
		}
		flags = uint32(golibvirt.DomainSnapshotRevertPaused)
	}
	if err := do(ctx, func() error { return c.r.DomainRevertToSnapshot(s, flags) }); err != nil {
		return fail(err)
	}
	if !info.Memory() {
		return nil
	}
	live, err := call(ctx, func() (string, error) { return c.r.DomainGetXMLDesc(d, 0) })
	if err != nil {
		return fail(fmt.Errorf("reading the paused guest's definition: %w", err))
	}
	if err := check(live); err != nil {
		return fail(fmt.Errorf("the guest it brought back (paused, never resumed): %w", err))
	}
	if info.State != StateRunning {
		return nil
	}
	if err := do(ctx, func() error { return c.r.DomainResume(d) }); err != nil {
		return fail(fmt.Errorf("resuming the checked guest: %w", err))
	}
	return nil
}

// DeleteSnapshot deletes snapshot name of a domain (its data in the
// overlay and libvirt's record; snapshots taken on top of it stay). A
// missing snapshot gives ErrNotFound.
func (c *Client) DeleteSnapshot(ctx context.Context, domain, name string) error {
	d, _, err := c.domain(ctx, domain)
	if err != nil {
		return fmt.Errorf("deleting snapshot %s of %s: %w", name, domain, err)
	}
	s, err := c.snapshot(ctx, d, name)
	if err != nil {
		return fmt.Errorf("deleting snapshot %s of %s: %w", name, domain, err)
	}
	if err := do(ctx, func() error { return c.r.DomainSnapshotDelete(s, 0) }); err != nil {
		if hasCode(err, golibvirt.ErrNoDomainSnapshot) {
			return fmt.Errorf("deleting snapshot %s of %s: %w: %w", name, domain, ErrNotFound, err)
		}
		return fmt.Errorf("deleting snapshot %s of %s: %w", name, domain, err)
	}
	return nil
}
