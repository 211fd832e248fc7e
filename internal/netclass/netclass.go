// Package netclass classifies IP addresses as public or as one of the special
// ranges a sandboxed guest must never reach, shared by the DNS and HTTP filters.
package netclass

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/validate"
)

// Class names the range an address belongs to. Public is the only class that
// is reachable by default.
type Class string

const (
	Public        Class = "public"
	Unspecified   Class = "unspecified"      // 0.0.0.0/8, ::
	Loopback      Class = "loopback"         // 127/8, ::1
	Private       Class = "private"          // RFC 1918
	CGNAT         Class = "cgnat"            // 100.64/10
	LinkLocal     Class = "link_local"       // 169.254/16, fe80::/10
	UniqueLocal   Class = "unique_local"     // fc00::/7, fec0::/10 (site-local)
	Multicast     Class = "multicast"        // 224/4, ff00::/8
	Broadcast     Class = "broadcast"        // 255.255.255.255
	Reserved      Class = "reserved"         // 240/4 and IPv6 outside 2000::/3
	IETFProtocol  Class = "ietf_protocol"    // 192.0.0/24, 2001::/23 special purpose
	Documentation Class = "documentation"    // TEST-NETs, 2001:db8::/32, 3fff::/20
	Benchmarking  Class = "benchmarking"     // 198.18/15, 2001:2::/48
	Relay6to4     Class = "relay_6to4"       // 192.88.99/24
	HostAddress   Class = "host_address"     // one of the host's own interface addresses
	HostNetwork   Class = "host_network"     // on an IPv6 network the host is attached to (the LAN)
	Instance      Class = "instance_network" // on the network of an abox bridge (another guest)
	Metadata      Class = "metadata"         // a cloud's instance metadata or platform endpoint
	Anycast       Class = "anycast"          // AS112, AMT and other special anycast services
	Embedded      Class = "embedded_v4"      // translation prefix with no usable embedded address
	Permitted     Class = "permitted"        // inside a range the user explicitly permitted
	Invalid       Class = "invalid"          // the zero Addr
)

type rangeClass struct {
	p netip.Prefix
	c Class
}

// v4Ranges are the IPv4 special-purpose ranges (IANA registry, RFC 6890 and
// successors) that are not globally reachable destinations.
var v4Ranges = []rangeClass{
	{netip.MustParsePrefix("0.0.0.0/8"), Unspecified},
	{netip.MustParsePrefix("10.0.0.0/8"), Private},
	{netip.MustParsePrefix("100.64.0.0/10"), CGNAT},
	{netip.MustParsePrefix("127.0.0.0/8"), Loopback},
	{netip.MustParsePrefix("169.254.0.0/16"), LinkLocal},
	{netip.MustParsePrefix("172.16.0.0/12"), Private},
	{netip.MustParsePrefix("192.0.0.0/24"), IETFProtocol},
	{netip.MustParsePrefix("192.0.2.0/24"), Documentation},
	{netip.MustParsePrefix("192.31.196.0/24"), Anycast}, // AS112-v4 (RFC 7535)
	{netip.MustParsePrefix("192.52.193.0/24"), Anycast}, // AMT (RFC 7450)
	{netip.MustParsePrefix("192.88.99.0/24"), Relay6to4},
	{netip.MustParsePrefix("192.168.0.0/16"), Private},
	{netip.MustParsePrefix("192.175.48.0/24"), Anycast}, // AS112 direct delegation (RFC 7534)
	{netip.MustParsePrefix("198.18.0.0/15"), Benchmarking},
	{netip.MustParsePrefix("198.51.100.0/24"), Documentation},
	{netip.MustParsePrefix("203.0.113.0/24"), Documentation},
	{netip.MustParsePrefix("224.0.0.0/4"), Multicast},
	{netip.MustParsePrefix("255.255.255.255/32"), Broadcast},
	{netip.MustParsePrefix("240.0.0.0/4"), Reserved},
}

var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local     = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour      = netip.MustParsePrefix("2002::/16")
	teredo         = netip.MustParsePrefix("2001::/32")
	v4Compatible   = netip.MustParsePrefix("::/96")
	globalUnicast  = netip.MustParsePrefix("2000::/3")
)

// v6Ranges are IPv6 special-purpose ranges inside 2000::/3 (everything outside
// 2000::/3 that is not handled explicitly is Reserved).
var v6Ranges = []rangeClass{
	{netip.MustParsePrefix("2001:db8::/32"), Documentation},
	{netip.MustParsePrefix("3fff::/20"), Documentation},
	{netip.MustParsePrefix("2001:2::/48"), Benchmarking},
	{netip.MustParsePrefix("2001::/23"), IETFProtocol},    // incl. PCP/TURN/DNS-SD anycast, AMT, AS112-v6, ORCHID
	{netip.MustParsePrefix("2620:4f:8000::/48"), Anycast}, // AS112 direct delegation (RFC 7534)
}

// metadata are the instance metadata, platform and link-local service
// endpoints of the clouds abox may run in. A guest reaching one through the
// host reads the host's credentials, so they are refused ahead of every
// permit, whatever range they lie in (Azure's wireserver is a public address).
var metadata = []netip.Prefix{
	netip.MustParsePrefix("169.254.169.0/24"),    // AWS/GCP/Azure/OpenStack/Oracle/DO/Hetzner IMDS, AWS DNS and NTP
	netip.MustParsePrefix("169.254.170.0/24"),    // AWS ECS task metadata, EKS pod identity
	netip.MustParsePrefix("169.254.0.23/32"),     // Tencent Cloud metadata
	netip.MustParsePrefix("168.63.129.16/32"),    // Azure wireserver (platform DNS, health, agent)
	netip.MustParsePrefix("100.100.100.200/32"),  // Alibaba Cloud metadata
	netip.MustParsePrefix("192.0.0.192/32"),      // Oracle Cloud metadata
	netip.MustParsePrefix("169.254.42.42/32"),    // Scaleway metadata
	netip.MustParsePrefix("fd00:ec2::/32"),       // AWS IMDS, DNS and NTP over IPv6
	netip.MustParsePrefix("fd20:ce::/32"),        // GCP metadata over IPv6
	netip.MustParsePrefix("fd00:c1::/32"),        // Oracle Cloud metadata over IPv6 (fd00:c1::a9fe:a9fe)
	netip.MustParsePrefix("fd00:42::42/128"),     // Scaleway metadata over IPv6
	netip.MustParsePrefix("fe80::a9fe:a9fe/128"), // OpenStack metadata over IPv6 (link-local)
}

func isMetadata(a netip.Addr) bool {
	for _, p := range metadata {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// v6Outside are the classes of well-known ranges outside 2000::/3, for better
// reasons than a bare "reserved".
var v6Outside = []rangeClass{
	{netip.MustParsePrefix("fe80::/10"), LinkLocal},
	{netip.MustParsePrefix("fc00::/7"), UniqueLocal},
	{netip.MustParsePrefix("fec0::/10"), UniqueLocal},
	{netip.MustParsePrefix("ff00::/8"), Multicast},
}

// Classify returns the class of a, looking inside IPv4-mapped, IPv4-compatible,
// NAT64, 6to4 and Teredo addresses: such an address is as reachable as the
// IPv4 address it carries.
func Classify(a netip.Addr) Class {
	if !a.IsValid() {
		return Invalid
	}
	a = a.WithZone("")
	if a.Is4In6() {
		return classify4(a.Unmap())
	}
	if a.Is4() {
		return classify4(a)
	}
	if isMetadata(a) {
		return Metadata
	}
	switch {
	case a == netip.IPv6Unspecified():
		return Unspecified
	case a == netip.IPv6Loopback():
		return Loopback
	case v4Compatible.Contains(a):
		// Deprecated IPv4-compatible form (::a.b.c.d); some stacks still route it.
		return embeddedOrBlocked(v4At(a, 12))
	case nat64WellKnown.Contains(a):
		return embeddedOrBlocked(v4At(a, 12))
	case nat64Local.Contains(a):
		// Local-use NAT64 prefixes are network-specific: the embedded address
		// position is unknown, so refuse the whole range.
		return Embedded
	case sixToFour.Contains(a):
		return embeddedOrBlocked(v4At(a, 2))
	case teredo.Contains(a):
		// Teredo carries the server address in bits 32-63 and the client's
		// address, inverted, in bits 96-127; both must be public.
		if c := classify4(v4At(a, 4)); c != Public {
			return c
		}
		b := a.As16()
		client := netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]})
		return classify4(client)
	}
	if !globalUnicast.Contains(a) {
		for _, r := range v6Outside {
			if r.p.Contains(a) {
				return r.c
			}
		}
		return Reserved
	}
	for _, r := range v6Ranges {
		if r.p.Contains(a) {
			return r.c
		}
	}
	return Public
}

func classify4(a netip.Addr) Class {
	if isMetadata(a) {
		return Metadata
	}
	for _, r := range v4Ranges {
		if r.p.Contains(a) {
			return r.c
		}
	}
	return Public
}

func embeddedOrBlocked(v4 netip.Addr) Class {
	return classify4(v4)
}

// v4At extracts the IPv4 address stored at byte offset off of an IPv6 address.
func v4At(a netip.Addr, off int) netip.Addr {
	b := a.As16()
	return netip.AddrFrom4([4]byte{b[off], b[off+1], b[off+2], b[off+3]})
}

// Embedded4 returns the IPv4 address an IPv6 address carries in a translation
// form (mapped, compatible, NAT64, 6to4), if any.
func Embedded4(a netip.Addr) (netip.Addr, bool) {
	a = a.WithZone("")
	switch {
	case a.Is4In6():
		return a.Unmap(), true
	case a.Is6() && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback() && v4Compatible.Contains(a):
		return v4At(a, 12), true
	case nat64WellKnown.Contains(a):
		return v4At(a, 12), true
	case sixToFour.Contains(a):
		return v4At(a, 2), true
	}
	return netip.Addr{}, false
}

// Policy decides which destination addresses a guest may reach. The zero value
// permits only public addresses. A Policy is safe for concurrent use.
type Policy struct {
	// permit holds ranges the user explicitly allowed (--allow-private). They
	// open private and reserved ranges and the host's IPv6 LAN, never the
	// host's own addresses, loopback, unspecified, abox instance networks or
	// metadata endpoints, so a wide range cannot open those by accident.
	permit []netip.Prefix
	// permitHost holds ranges allowed with --allow-host: like permit, and
	// also the host's own addresses, loopback and instance networks. Metadata
	// endpoints stay refused whatever is permitted.
	permitHost []netip.Prefix
	// host holds the host's own addresses given to NewPolicy, never
	// reachable unless permitted.
	host map[netip.Addr]bool
	// live, set when NewPolicy was given host addresses, follows the host's
	// interfaces: addresses that appear after start (DHCP, IPv6 temporary
	// addresses, new bridges) and every network an interface sits on.
	live *liveHost
	// nat64 are the host network's NAT64 prefixes; nil knows none.
	nat64 *NAT64
}

// Options configures New.
type Options struct {
	// Permit are the --allow-private ranges (see Policy.permit).
	Permit []netip.Prefix
	// PermitHost are the --allow-host ranges (see Policy.permitHost).
	PermitHost []netip.Prefix
	// Host are the host's own addresses (see HostAddrs); giving any makes
	// the policy follow the host's interfaces.
	Host []netip.Addr
	// NAT64 are the network-specific NAT64 prefixes of the host's network:
	// an address under one is judged as the IPv4 address it embeds.
	NAT64 *NAT64
}

// NewPolicy builds a policy. permit are the explicitly allowed ranges; host are
// the host's own addresses (see HostAddrs). A policy given host addresses is
// the host's: it also re-reads the host's interfaces (at most once per
// hostRefresh) and refuses their current addresses, every address on the
// IPv6 networks they are attached to (HostNetwork), a LAN neighbour with a
// global IPv6 address is not the internet, and every address on the networks
// of abox bridges (Instance: the other guests).
func NewPolicy(permit []netip.Prefix, host []netip.Addr) *Policy {
	return New(Options{Permit: permit, Host: host})
}

// New builds a policy from o.
func New(o Options) *Policy {
	p := &Policy{host: make(map[netip.Addr]bool, len(o.Host)), nat64: o.NAT64}
	for _, pr := range o.Permit {
		p.permit = append(p.permit, pr.Masked())
	}
	for _, pr := range o.PermitHost {
		p.permitHost = append(p.permitHost, pr.Masked())
	}
	for _, h := range o.Host {
		p.host[h.WithZone("").Unmap()] = true
	}
	if len(o.Host) > 0 {
		p.live = &liveHost{}
	}
	return p
}

// Check returns Public or Permitted for an address a guest may reach, and the
// blocking class otherwise.
func (p *Policy) Check(a netip.Addr) Class {
	if !a.IsValid() {
		return Invalid
	}
	a = a.WithZone("")
	c := Classify(a)
	if c == Metadata {
		return Metadata
	}
	if p == nil {
		return c
	}
	if v4, ok := p.nat64.embedded(a); ok {
		// The host's NAT64 gateway reaches v4 for this address: it is
		// refused whenever v4 itself would be.
		if c4 := p.Check(v4); !Allowed(c4) {
			return c4
		}
	}
	cands := []netip.Addr{a.Unmap()}
	if v4, ok := Embedded4(a); ok {
		cands = append(cands, v4)
		if isMetadata(v4) {
			return Metadata
		}
	}
	if within(p.permitHost, cands) {
		return Permitted
	}
	if c == Loopback || c == Unspecified {
		return c
	}
	if hc := p.hostClass(cands); hc != "" && hc != HostNetwork {
		return hc
	}
	if within(p.permit, cands) {
		return Permitted
	}
	if c != Public {
		return c
	}
	if hc := p.hostClass(cands); hc != "" {
		return hc
	}
	return Public
}

// hostClass is HostAddress, Instance or HostNetwork when one of cands is on
// the host, and empty otherwise.
func (p *Policy) hostClass(cands []netip.Addr) Class {
	var snap *hostSnapshot
	if p.live != nil {
		snap = p.live.get()
	}
	for _, c := range cands {
		if p.host[c] || snap != nil && snap.addrs[c] {
			return HostAddress
		}
	}
	if snap == nil {
		return ""
	}
	for _, n := range snap.instances {
		for _, c := range cands {
			if n.Contains(c) {
				return Instance
			}
		}
	}
	for _, n := range snap.nets {
		for _, c := range cands {
			if n.Contains(c) {
				return HostNetwork
			}
		}
	}
	return ""
}

func within(ps []netip.Prefix, cands []netip.Addr) bool {
	for _, pr := range ps {
		for _, c := range cands {
			if pr.Contains(c) {
				return true
			}
		}
	}
	return false
}

// siteBits6 is the prefix length of the IPv6 site around a host
// interface's global address: every address in it is HostNetwork.
const siteBits6 = 56

// hostRefresh bounds how stale the view of the host's interfaces may be.
const hostRefresh = time.Second

// interfaceAddrs, bridgeAddrs and clock are replaced by tests.
var (
	interfaceAddrs = net.InterfaceAddrs
	bridgeAddrs    = aboxBridgeAddrs
	clock          = time.Now
)

// aboxBridgeAddrs lists the addresses of the host's abox bridges: each sits
// on one instance's network, whose other addresses are guests. Only bridges
// count: another link that happens to carry the prefix (a veth, a test
// lab's) is no instance network.
func aboxBridgeAddrs() ([]net.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var out []net.Addr
	for _, ifc := range ifs {
		if !strings.HasPrefix(ifc.Name, validate.BridgePrefix) || !isBridge(ifc.Name) {
			continue
		}
		as, err := ifc.Addrs()
		if err != nil {
			return nil, err
		}
		out = append(out, as...)
	}
	return out, nil
}

// hostSnapshot is one reading of the host's interfaces.
type hostSnapshot struct {
	at    time.Time
	addrs map[netip.Addr]bool
	nets  []netip.Prefix
	// instances are the networks of abox bridges, IPv4 and IPv6.
	instances []netip.Prefix
}

// liveHost caches the host's interface addresses and networks.
type liveHost struct {
	mu   sync.Mutex // serialises refreshes
	snap atomic.Pointer[hostSnapshot]
}

// get returns a snapshot no older than hostRefresh when the interfaces can
// be read, else the last good one. The first reading is synchronous, so no
// check ever runs without one.
func (l *liveHost) get() *hostSnapshot {
	s := l.snap.Load()
	if s != nil && clock().Sub(s.at) < hostRefresh {
		return s
	}
	if s != nil && !l.mu.TryLock() {
		return s // another goroutine is refreshing; a second's staleness is the bound
	}
	if s == nil {
		l.mu.Lock()
	}
	defer l.mu.Unlock()
	if cur := l.snap.Load(); cur != nil && clock().Sub(cur.at) < hostRefresh {
		return cur
	}
	ns := readHost()
	if ns == nil {
		if s == nil {
			// Unreadable interfaces: refuse nothing more than the static
			// list, and try again on the next check.
			return &hostSnapshot{}
		}
		return s
	}
	l.snap.Store(ns)
	return ns
}

func readHost() *hostSnapshot {
	addrs, err := interfaceAddrs()
	if err != nil {
		return nil
	}
	s := &hostSnapshot{at: clock(), addrs: make(map[netip.Addr]bool, len(addrs))}
	for _, a := range addrs {
		pn, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(pn.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		s.addrs[ip] = true
		ones, _ := pn.Mask.Size()
		if ip.Is4() && len(pn.Mask) == net.IPv6len {
			ones -= 96
		}
		// IPv6 only: a home or office LAN numbers its IPv4 hosts in private
		// ranges (refused anyway) but gives them global IPv6 addresses that
		// only the router's firewall shields, which the host is behind. A
		// public IPv4 subnet on an interface is a server's uplink, whose
		// neighbours are internet hosts. A default-route sized "network" is
		// never a LAN.
		if !ip.Is6() || ones <= 0 {
			continue
		}
		// The interface's /64 is one subnet of the site: the router's
		// other subnets (a home's IoT VLAN, an office's printers, the other
		// subnets of a cloud VPC, which gets a /56) sit behind the same
		// firewall and are reached through it. A global prefix counts as
		// the site's /56 around it (RFC 6177: sites get a /56 or a /48).
		if ones > siteBits6 && ip.IsGlobalUnicast() && !ip.IsPrivate() {
			ones = siteBits6
		}
		if pr, err := ip.Prefix(ones); err == nil {
			s.nets = append(s.nets, pr)
		}
	}
	if bs, err := bridgeAddrs(); err == nil {
		for _, a := range bs {
			if pr, ok := ifacePrefix(a); ok {
				s.instances = append(s.instances, pr)
			}
		}
	}
	return s
}

// isBridge reports whether the link name is a Linux bridge. When sysfs
// cannot say (not mounted, not readable), the link is taken for one: the
// cost of a wrong guess is a refused neighbour, not an opened guest.
func isBridge(name string) bool {
	link := "/sys/class/net/" + name
	if _, err := os.Stat(link); err != nil {
		return true // sysfs does not show this namespace's links
	}
	_, err := os.Stat(link + "/bridge")
	return !errors.Is(err, fs.ErrNotExist)
}

// ifacePrefix is the network an interface address sits on.
func ifacePrefix(a net.Addr) (netip.Prefix, bool) {
	pn, ok := a.(*net.IPNet)
	if !ok {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(pn.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	ones, _ := pn.Mask.Size()
	if ip.Is4() && len(pn.Mask) == net.IPv6len {
		ones -= 96
	}
	pr, err := ip.Prefix(ones)
	return pr, err == nil
}

// Allowed reports whether Check's class lets traffic through.
func Allowed(c Class) bool { return c == Public || c == Permitted }

// HostAddrs returns the addresses of every interface of this host. Filters add
// them to a Policy so that a guest cannot reach services on the host through
// an address that happens to be public.
func HostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing host addresses: %w", err)
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if pn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(pn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
