package libvirt

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
)

// DefaultSubnetPool is where instance /24s come from unless configured.
const DefaultSubnetPool = "10.10.0.0/16"

// LibvirtDefaultSubnet is the subnet of the NAT network Debian's libvirt
// defines as "default". It is never handed out, even when that network is
// not currently defined or routed, because libvirt may (re)create it at
// any time.
const LibvirtDefaultSubnet = "192.168.122.0/24"

// AllocateSubnet returns the first /24 in pool that overlaps none of used
// and not libvirt's default network. used should hold the subnets of
// other instances, of all libvirt networks and of the host's routes
// (HostRoutes); a default route must not be among them, since it overlaps
// everything. The choice is deterministic; callers serialise allocation
// (under the instance store's lock) so that concurrent creates cannot pick
// the same subnet.
func AllocateSubnet(pool netip.Prefix, used []netip.Prefix) (netip.Prefix, error) {
	if !pool.IsValid() || !pool.Addr().Is4() || pool.Bits() > 24 {
		return netip.Prefix{}, fmt.Errorf("allocating subnet: pool %v must be an IPv4 prefix of /24 or larger", pool)
	}
	pool = pool.Masked()
	avoid := append([]netip.Prefix{netip.MustParsePrefix(LibvirtDefaultSubnet)}, used...)
	b := pool.Addr().As4()
	base := binary.BigEndian.Uint32(b[:])
	n := uint32(1) << (24 - pool.Bits())
	for i := uint32(0); i < n; i++ {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], base+i<<8)
		cand := netip.PrefixFrom(netip.AddrFrom4(a), 24)
		if !overlapsAny(cand, avoid) {
			return cand, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("allocating subnet: every /24 in %v is in use or overlaps a host route; remove unused instances or configure another pool", pool)
}

func overlapsAny(p netip.Prefix, set []netip.Prefix) bool {
	for _, u := range set {
		if u.IsValid() && p.Overlaps(u) {
			return true
		}
	}
	return false
}

// InstanceAddresses returns the conventional gateway (.1) and guest (.10)
// addresses of an instance /24.
func InstanceAddresses(subnet netip.Prefix) (gateway, guest netip.Addr) {
	a := subnet.Masked().Addr().As4()
	a[3] = 1
	gateway = netip.AddrFrom4(a)
	a[3] = 10
	guest = netip.AddrFrom4(a)
	return gateway, guest
}

// Runner runs a program and returns its standard output. ExecRunner is
// the real one; tests substitute canned output.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// HostRoutes returns the destinations of the host's IPv4 routes in every
// routing table (policy routing, VPNs and local addresses included) as
// reported by `ip -j -4 route show table all`. Default routes are left out:
// they overlap everything and say nothing about which subnets are taken.
func HostRoutes(ctx context.Context, r Runner) ([]netip.Prefix, error) {
	out, err := r.Run(ctx, "ip", "-j", "-4", "route", "show", "table", "all")
	if err != nil {
		return nil, fmt.Errorf("listing host routes: %w", err)
	}
	return parseRoutes(out)
}

func parseRoutes(out []byte) ([]netip.Prefix, error) {
	var routes []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal(out, &routes); err != nil {
		return nil, fmt.Errorf("parsing host routes: %w", err)
	}
	var res []netip.Prefix
	for _, rt := range routes {
		if rt.Dst == "" || rt.Dst == "default" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(rt.Dst, "/") {
			p, err = netip.ParsePrefix(rt.Dst)
		} else {
			var a netip.Addr
			a, err = netip.ParseAddr(rt.Dst)
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if err != nil {
			return nil, fmt.Errorf("parsing host route %q: %w", rt.Dst, err)
		}
		if p.Bits() == 0 {
			continue // 0.0.0.0/0 written out: a default route
		}
		res = append(res, p.Masked())
	}
	return res, nil
}
