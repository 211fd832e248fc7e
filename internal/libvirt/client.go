package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"libvirt.org/go/libvirtxml"
)

// DefaultSocket is libvirtd's system socket.
const DefaultSocket = "/var/run/libvirt/libvirt-sock"

// ErrNotFound is returned (wrapped) when a domain, network or nwfilter
// that must exist does not. Operations that remove something treat a
// missing object as already done and do not return it.
var ErrNotFound = errors.New("not found")

// remote is the part of go-libvirt's RPC client this package uses. It
// exists so the idempotency rules below can be tested without libvirtd;
// *golibvirt.Libvirt is the only real implementation.
type remote interface {
	Disconnect() error

	ConnectListAllNetworks(needResults int32, flags golibvirt.ConnectListAllNetworksFlags) ([]golibvirt.Network, uint32, error)
	NetworkLookupByName(name string) (golibvirt.Network, error)
	NetworkDefineXML(xml string) (golibvirt.Network, error)
	NetworkCreate(n golibvirt.Network) error
	NetworkIsActive(n golibvirt.Network) (int32, error)
	NetworkDestroy(n golibvirt.Network) error
	NetworkUndefine(n golibvirt.Network) error
	NetworkGetXMLDesc(n golibvirt.Network, flags uint32) (string, error)

	NwfilterLookupByName(name string) (golibvirt.Nwfilter, error)
	NwfilterDefineXML(xml string) (golibvirt.Nwfilter, error)
	NwfilterUndefine(f golibvirt.Nwfilter) error

	DomainLookupByName(name string) (golibvirt.Domain, error)
	DomainDefineXMLFlags(xml string, flags golibvirt.DomainDefineFlags) (golibvirt.Domain, error)
	DomainCreate(d golibvirt.Domain) error
	DomainShutdownFlags(d golibvirt.Domain, flags golibvirt.DomainShutdownFlagValues) error
	DomainDestroy(d golibvirt.Domain) error
	DomainUndefineFlags(d golibvirt.Domain, flags golibvirt.DomainUndefineFlagsValues) error
	DomainGetState(d golibvirt.Domain, flags uint32) (int32, int32, error)
	DomainUpdateDeviceFlags(d golibvirt.Domain, xml string, flags golibvirt.DomainDeviceModifyFlags) error
	DomainGetXMLDesc(d golibvirt.Domain, flags golibvirt.DomainXMLFlags) (string, error)
	DomainResume(d golibvirt.Domain) error

	DomainSnapshotCreateXML(d golibvirt.Domain, xml string, flags uint32) (golibvirt.DomainSnapshot, error)
	DomainSnapshotLookupByName(d golibvirt.Domain, name string, flags uint32) (golibvirt.DomainSnapshot, error)
	DomainListAllSnapshots(d golibvirt.Domain, needResults int32, flags uint32) ([]golibvirt.DomainSnapshot, int32, error)
	DomainSnapshotGetXMLDesc(s golibvirt.DomainSnapshot, flags uint32) (string, error)
	DomainSnapshotIsCurrent(s golibvirt.DomainSnapshot, flags uint32) (int32, error)
	DomainRevertToSnapshot(s golibvirt.DomainSnapshot, flags uint32) error
	DomainSnapshotDelete(s golibvirt.DomainSnapshot, flags golibvirt.DomainSnapshotDeleteFlags) error
}

// Client talks to one libvirtd over its RPC socket. It is safe for
// concurrent use (go-libvirt multiplexes calls on the connection).
//
// The order an orchestrator uses: to start, DefineNetwork, StartNetwork,
// (host firewall), DefineNWFilter, DefineDomain, StartDomain — the filter
// must exist before the domain starts, or libvirt refuses to start it; to
// stop, ShutdownDomain then WaitShutoff, DestroyDomain only on timeout;
// to remove, DestroyDomain, UndefineDomain, UndefineNWFilter (libvirt
// refuses while a domain references it), DestroyNetwork, UndefineNetwork.
// Every step is idempotent, so a failed sequence can simply be rerun.
type Client struct {
	r remote
}

// Dial connects to libvirtd's qemu:///system driver through the unix
// socket at path (DefaultSocket when empty).
func Dial(ctx context.Context, path string) (*Client, error) {
	if path == "" {
		path = DefaultSocket
	}
	opts := []dialers.LocalOption{dialers.WithSocket(path)}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, dialers.WithLocalTimeout(time.Until(dl)))
	}
	l := golibvirt.NewWithDialer(dialers.NewLocal(opts...))
	if err := do(ctx, func() error { return l.ConnectToURI(golibvirt.QEMUSystem) }); err != nil {
		return nil, fmt.Errorf("connecting to libvirtd at %s: %w (is libvirtd running? start it with `libvirtd -d`)", path, err)
	}
	return &Client{r: l}, nil
}

// Close ends the connection.
func (c *Client) Close() error {
	if err := c.r.Disconnect(); err != nil {
		return fmt.Errorf("disconnecting from libvirtd: %w", err)
	}
	return nil
}

// do runs a blocking RPC and gives up when ctx ends. go-libvirt's calls
// take no context, so a call abandoned this way still completes on the
// connection in the background; its result is discarded.
func do(ctx context.Context, f func() error) error {
	_, err := call(ctx, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

func call[T any](ctx context.Context, f func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1) // buffered: an abandoned call must not block forever
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return zero, ctx.Err()
	}
}

func hasCode(err error, code golibvirt.ErrorNumber) bool {
	var e golibvirt.Error
	return errors.As(err, &e) && e.Code == uint32(code)
}

// notFound turns libvirt's "no such object" codes into ErrNotFound so
// callers need not know libvirt's error numbers.
func notFound(err error) error {
	if hasCode(err, golibvirt.ErrNoDomain) || hasCode(err, golibvirt.ErrNoNetwork) || hasCode(err, golibvirt.ErrNoNwfilter) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// DefineNetwork creates or updates the persistent definition of a network.
// Updating an active network changes only its persistent definition;
// libvirt applies it at the next start.
func (c *Client) DefineNetwork(ctx context.Context, xml string) error {
	if _, err := call(ctx, func() (golibvirt.Network, error) { return c.r.NetworkDefineXML(xml) }); err != nil {
		return fmt.Errorf("defining network: %w", err)
	}
	return nil
}

// StartNetwork starts a defined network; an active network is left alone.
func (c *Client) StartNetwork(ctx context.Context, name string) error {
	n, active, err := c.network(ctx, name)
	if err != nil {
		return fmt.Errorf("starting network %s: %w", name, err)
	}
	if active {
		return nil
	}
	if err := do(ctx, func() error { return c.r.NetworkCreate(n) }); err != nil {
		// Lost a race with another starter: fine if it is up now.
		if hasCode(err, golibvirt.ErrOperationInvalid) {
			if _, active, err2 := c.network(ctx, name); err2 == nil && active {
				return nil
			}
		}
		return fmt.Errorf("starting network %s: %w", name, err)
	}
	return nil
}

// DestroyNetwork stops a network; a missing or inactive one is fine.
func (c *Client) DestroyNetwork(ctx context.Context, name string) error {
	n, active, err := c.network(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("stopping network %s: %w", name, err)
	}
	if !active {
		return nil
	}
	if err := do(ctx, func() error { return c.r.NetworkDestroy(n) }); err != nil {
		if hasCode(err, golibvirt.ErrOperationInvalid) || hasCode(err, golibvirt.ErrNoNetwork) {
			if _, active, err2 := c.network(ctx, name); errors.Is(err2, ErrNotFound) || (err2 == nil && !active) {
				return nil
			}
		}
		return fmt.Errorf("stopping network %s: %w", name, err)
	}
	return nil
}

// UndefineNetwork removes a network's persistent definition; a missing one
// is fine. An active network keeps running until destroyed, so callers
// destroy first.
func (c *Client) UndefineNetwork(ctx context.Context, name string) error {
	n, _, err := c.network(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("undefining network %s: %w", name, err)
	}
	if err := do(ctx, func() error { return c.r.NetworkUndefine(n) }); err != nil && !hasCode(err, golibvirt.ErrNoNetwork) {
		return fmt.Errorf("undefining network %s: %w", name, err)
	}
	return nil
}

// NetworkActive reports whether a network is running; a missing network
// gives ErrNotFound.
func (c *Client) NetworkActive(ctx context.Context, name string) (bool, error) {
	_, active, err := c.network(ctx, name)
	if err != nil {
		return false, fmt.Errorf("querying network %s: %w", name, err)
	}
	return active, nil
}

func (c *Client) network(ctx context.Context, name string) (golibvirt.Network, bool, error) {
	n, err := call(ctx, func() (golibvirt.Network, error) { return c.r.NetworkLookupByName(name) })
	if err != nil {
		return n, false, notFound(err)
	}
	active, err := call(ctx, func() (int32, error) { return c.r.NetworkIsActive(n) })
	if err != nil {
		return n, false, notFound(err)
	}
	return n, active == 1, nil
}

// NetworkInfo is what the subnet allocator needs to know about a libvirt
// network abox may not own.
type NetworkInfo struct {
	Name    string
	Bridge  string
	Subnets []netip.Prefix // IPv4 and IPv6 prefixes of its <ip> elements
}

// ListNetworks returns every network libvirtd knows, active or not, with
// its subnets, so a new instance's subnet avoids all of them.
func (c *Client) ListNetworks(ctx context.Context) ([]NetworkInfo, error) {
	nets, err := call(ctx, func() ([]golibvirt.Network, error) {
		n, _, err := c.r.ConnectListAllNetworks(1, 0)
		return n, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing networks: %w", err)
	}
	var res []NetworkInfo
	for _, n := range nets {
		doc, err := call(ctx, func() (string, error) { return c.r.NetworkGetXMLDesc(n, 0) })
		if hasCode(err, golibvirt.ErrNoNetwork) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("listing networks: reading %s: %w", n.Name, err)
		}
		info, err := parseNetworkInfo(doc)
		if err != nil {
			return nil, fmt.Errorf("listing networks: %w", err)
		}
		res = append(res, info)
	}
	return res, nil
}

func parseNetworkInfo(doc string) (NetworkInfo, error) {
	var n libvirtxml.Network
	if err := n.Unmarshal(doc); err != nil {
		return NetworkInfo{}, fmt.Errorf("parsing network XML: %w", err)
	}
	info := NetworkInfo{Name: n.Name}
	if n.Bridge != nil {
		info.Bridge = n.Bridge.Name
	}
	for _, ip := range n.IPs {
		a, err := netip.ParseAddr(ip.Address)
		if err != nil {
			return NetworkInfo{}, fmt.Errorf("network %s: address %q: %w", n.Name, ip.Address, err)
		}
		bits := int(ip.Prefix)
		if ip.Netmask != "" {
			m, err := netip.ParseAddr(ip.Netmask)
			if err != nil || !m.Is4() {
				return NetworkInfo{}, fmt.Errorf("network %s: netmask %q: not an IPv4 mask", n.Name, ip.Netmask)
			}
			bits = maskBits(m.As4())
		} else if bits == 0 && a.Is4() {
			bits = 24 // libvirt's default when neither prefix nor netmask is given
		}
		p, err := a.Prefix(bits)
		if err != nil {
			return NetworkInfo{}, fmt.Errorf("network %s: prefix %d: %w", n.Name, bits, err)
		}
		info.Subnets = append(info.Subnets, p)
	}
	return info, nil
}

func maskBits(m [4]byte) int {
	n := 0
	for _, b := range m {
		for i := 7; i >= 0 && b&(1<<i) != 0; i-- {
			n++
		}
		if b != 0xff {
			break
		}
	}
	return n
}

// DefineNWFilter creates or updates an nwfilter. libvirt re-applies an
// updated filter to running guests immediately.
func (c *Client) DefineNWFilter(ctx context.Context, xml string) error {
	if _, err := call(ctx, func() (golibvirt.Nwfilter, error) { return c.r.NwfilterDefineXML(xml) }); err != nil {
		return fmt.Errorf("defining nwfilter: %w", err)
	}
	return nil
}

// UndefineNWFilter removes an nwfilter; a missing one is fine. libvirt
// refuses while a defined domain references it, so callers undefine the
// domain first.
func (c *Client) UndefineNWFilter(ctx context.Context, name string) error {
	f, err := call(ctx, func() (golibvirt.Nwfilter, error) { return c.r.NwfilterLookupByName(name) })
	if hasCode(err, golibvirt.ErrNoNwfilter) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("undefining nwfilter %s: %w", name, err)
	}
	if err := do(ctx, func() error { return c.r.NwfilterUndefine(f) }); err != nil && !hasCode(err, golibvirt.ErrNoNwfilter) {
		return fmt.Errorf("undefining nwfilter %s: %w", name, err)
	}
	return nil
}

// NWFilterExists reports whether an nwfilter is defined.
func (c *Client) NWFilterExists(ctx context.Context, name string) (bool, error) {
	_, err := call(ctx, func() (golibvirt.Nwfilter, error) { return c.r.NwfilterLookupByName(name) })
	if hasCode(err, golibvirt.ErrNoNwfilter) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("looking up nwfilter %s: %w", name, err)
	}
	return true, nil
}

// DomainState is a domain's run state as libvirt reports it.
type DomainState string

const (
	StateNoState     DomainState = "nostate"
	StateRunning     DomainState = "running"
	StateBlocked     DomainState = "blocked"
	StatePaused      DomainState = "paused"
	StateShuttingOff DomainState = "shutdown" // shutting down, still running
	StateShutoff     DomainState = "shutoff"
	StateCrashed     DomainState = "crashed"
	StateSuspended   DomainState = "pmsuspended"
)

func stateOf(s int32) DomainState {
	switch golibvirt.DomainState(s) {
	case golibvirt.DomainRunning:
		return StateRunning
	case golibvirt.DomainBlocked:
		return StateBlocked
	case golibvirt.DomainPaused:
		return StatePaused
	case golibvirt.DomainShutdown:
		return StateShuttingOff
	case golibvirt.DomainShutoff:
		return StateShutoff
	case golibvirt.DomainCrashed:
		return StateCrashed
	case golibvirt.DomainPmsuspended:
		return StateSuspended
	}
	return StateNoState
}

// Active reports whether a domain in this state has a QEMU process.
func (s DomainState) Active() bool {
	return s != StateShutoff && s != StateNoState && s != StateCrashed
}

// DefineDomain creates or updates a domain's persistent definition,
// asking libvirt to validate it against its schema first.
func (c *Client) DefineDomain(ctx context.Context, xml string) error {
	if _, err := call(ctx, func() (golibvirt.Domain, error) {
		return c.r.DomainDefineXMLFlags(xml, golibvirt.DomainDefineValidate)
	}); err != nil {
		return fmt.Errorf("defining domain: %w", err)
	}
	return nil
}

func (c *Client) domain(ctx context.Context, name string) (golibvirt.Domain, DomainState, error) {
	d, err := call(ctx, func() (golibvirt.Domain, error) { return c.r.DomainLookupByName(name) })
	if err != nil {
		return d, StateNoState, notFound(err)
	}
	st, err := call(ctx, func() (int32, error) {
		s, _, err := c.r.DomainGetState(d, 0)
		return s, err
	})
	if err != nil {
		return d, StateNoState, notFound(err)
	}
	return d, stateOf(st), nil
}

// State returns a domain's state; a missing domain gives ErrNotFound.
func (c *Client) State(ctx context.Context, name string) (DomainState, error) {
	_, st, err := c.domain(ctx, name)
	if err != nil {
		return st, fmt.Errorf("querying domain %s: %w", name, err)
	}
	return st, nil
}

// StartDomain boots a defined domain; a running one is left alone.
func (c *Client) StartDomain(ctx context.Context, name string) error {
	d, st, err := c.domain(ctx, name)
	if err != nil {
		return fmt.Errorf("starting domain %s: %w", name, err)
	}
	if st.Active() {
		return nil
	}
	if err := do(ctx, func() error { return c.r.DomainCreate(d) }); err != nil {
		if hasCode(err, golibvirt.ErrOperationInvalid) {
			if _, st, err2 := c.domain(ctx, name); err2 == nil && st.Active() {
				return nil
			}
		}
		return fmt.Errorf("starting domain %s: %w", name, err)
	}
	return nil
}

// ShutdownDomain asks the guest to power off by pressing the ACPI power
// button and returns without waiting (see WaitShutoff). A stopped or
// missing domain is fine.
func (c *Client) ShutdownDomain(ctx context.Context, name string) error {
	d, st, err := c.domain(ctx, name)
	if errors.Is(err, ErrNotFound) || (err == nil && !st.Active()) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("shutting down domain %s: %w", name, err)
	}
	if err := do(ctx, func() error { return c.r.DomainShutdownFlags(d, golibvirt.DomainShutdownAcpiPowerBtn) }); err != nil {
		if hasCode(err, golibvirt.ErrOperationInvalid) || hasCode(err, golibvirt.ErrNoDomain) {
			if _, st, err2 := c.domain(ctx, name); errors.Is(err2, ErrNotFound) || (err2 == nil && !st.Active()) {
				return nil
			}
		}
		return fmt.Errorf("shutting down domain %s: %w", name, err)
	}
	return nil
}

// WaitShutoff polls until the domain is no longer running (or is gone),
// every interval, until ctx ends. libvirt's lifecycle events would avoid
// polling but need a second connection and stream; a shutdown takes
// seconds, so a one-second poll costs nothing.
func (c *Client) WaitShutoff(ctx context.Context, name string, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		_, st, err := c.domain(ctx, name)
		if errors.Is(err, ErrNotFound) || (err == nil && !st.Active()) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("waiting for domain %s to stop: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for domain %s to stop: %w", name, ctx.Err())
		case <-t.C:
		}
	}
}

// DestroyDomain powers a domain off at once; a stopped or missing one is
// fine. Prefer ShutdownDomain: a hard power-off soon after first boot can
// lose files the guest just wrote (LAB.md).
func (c *Client) DestroyDomain(ctx context.Context, name string) error {
	d, st, err := c.domain(ctx, name)
	if errors.Is(err, ErrNotFound) || (err == nil && !st.Active()) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("destroying domain %s: %w", name, err)
	}
	if err := do(ctx, func() error { return c.r.DomainDestroy(d) }); err != nil {
		if hasCode(err, golibvirt.ErrOperationInvalid) || hasCode(err, golibvirt.ErrNoDomain) {
			if _, st, err2 := c.domain(ctx, name); errors.Is(err2, ErrNotFound) || (err2 == nil && !st.Active()) {
				return nil
			}
		}
		return fmt.Errorf("destroying domain %s: %w", name, err)
	}
	return nil
}

// UndefineDomain removes a domain's persistent definition together with
// its managed-save image, snapshot and checkpoint metadata and NVRAM, so
// nothing of it is left in libvirt; a missing domain is fine. A running
// domain becomes transient, so callers stop it first.
func (c *Client) UndefineDomain(ctx context.Context, name string) error {
	d, _, err := c.domain(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("undefining domain %s: %w", name, err)
	}
	flags := golibvirt.DomainUndefineManagedSave | golibvirt.DomainUndefineSnapshotsMetadata |
		golibvirt.DomainUndefineCheckpointsMetadata | golibvirt.DomainUndefineNvram
	if err := do(ctx, func() error { return c.r.DomainUndefineFlags(d, flags) }); err != nil && !hasCode(err, golibvirt.ErrNoDomain) {
		return fmt.Errorf("undefining domain %s: %w", name, err)
	}
	return nil
}

// SetLinkDown takes the running guest's NIC with the given MAC off its
// network (the link state the guest sees goes down and no frame passes),
// without touching the persistent definition: the last resort when the
// layers around a running guest cannot be restored.
func (c *Client) SetLinkDown(ctx context.Context, domain, network, filter, mac string) error {
	d, st, err := c.domain(ctx, domain)
	if err != nil {
		return fmt.Errorf("taking the link of %s down: %w", domain, err)
	}
	if !st.Active() {
		return nil
	}
	nic := libvirtxml.DomainInterface{
		MAC:       &libvirtxml.DomainInterfaceMAC{Address: mac},
		Source:    &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: network}},
		Model:     &libvirtxml.DomainInterfaceModel{Type: "virtio"},
		FilterRef: &libvirtxml.DomainInterfaceFilterRef{Filter: filter},
		Link:      &libvirtxml.DomainInterfaceLink{State: "down"},
	}
	doc, err := nic.Marshal()
	if err != nil {
		return fmt.Errorf("taking the link of %s down: %w", domain, err)
	}
	if err := do(ctx, func() error {
		return c.r.DomainUpdateDeviceFlags(d, doc, golibvirt.DomainDeviceModifyLive)
	}); err != nil {
		return fmt.Errorf("taking the link of %s down: %w", domain, err)
	}
	return nil
}
