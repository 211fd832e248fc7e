package netclass

import (
	"net/netip"
	"slices"
	"sync/atomic"
)

// NAT64 holds the network-specific NAT64 prefixes (RFC 6052) of the host's
// network: a NAT64 gateway translates an address under such a prefix into
// the IPv4 address it embeds, so that address is what the guest would
// reach, as for 64:ff9b::/96. Unlike the well-known prefix, a
// network-specific one may embed private addresses, and it is known only to
// the network (DiscoverNAT64 learns it the RFC 7050 way). The zero value
// holds none; it is safe for concurrent use.
type NAT64 struct {
	p atomic.Pointer[[]netip.Prefix]
}

// Set replaces the prefixes.
func (n *NAT64) Set(ps []netip.Prefix) {
	ps = slices.Clone(ps)
	n.p.Store(&ps)
}

// Prefixes returns the prefixes in force.
func (n *NAT64) Prefixes() []netip.Prefix {
	if n == nil {
		return nil
	}
	if p := n.p.Load(); p != nil {
		return slices.Clone(*p)
	}
	return nil
}

// embedded returns the IPv4 address a carries under one of n's prefixes.
func (n *NAT64) embedded(a netip.Addr) (netip.Addr, bool) {
	if n == nil || !a.Is6() || a.Is4In6() {
		return netip.Addr{}, false
	}
	p := n.p.Load()
	if p == nil {
		return netip.Addr{}, false
	}
	for _, pr := range *p {
		if pr.Contains(a) {
			return Extract6052(a, pr.Bits())
		}
	}
	return netip.Addr{}, false
}

// v4Bytes are the byte offsets of the embedded IPv4 address for each RFC
// 6052 prefix length: bits 64-71 (byte 8, the "u" octet) never carry it.
var v4Bytes = map[int][4]int{
	32: {4, 5, 6, 7},
	40: {5, 6, 7, 9},
	48: {6, 7, 9, 10},
	56: {7, 9, 10, 11},
	64: {9, 10, 11, 12},
	96: {12, 13, 14, 15},
}

// Extract6052 returns the IPv4 address embedded in a by a NAT64 prefix of
// the given length (32, 40, 48, 56, 64 or 96 bits, RFC 6052 2.2).
func Extract6052(a netip.Addr, bits int) (netip.Addr, bool) {
	off, ok := v4Bytes[bits]
	if !ok || !a.Is6() {
		return netip.Addr{}, false
	}
	b := a.As16()
	return netip.AddrFrom4([4]byte{b[off[0]], b[off[1]], b[off[2]], b[off[3]]}), true
}

// ipv4onlyAddrs are the well-known IPv4 addresses of ipv4only.arpa (RFC 7050).
var ipv4onlyAddrs = []netip.Addr{netip.MustParseAddr("192.0.0.170"), netip.MustParseAddr("192.0.0.171")}

// PrefixesFromIPv4Only derives the NAT64 prefixes from the AAAA answer a
// DNS64 resolver synthesised for ipv4only.arpa (RFC 7050 3): every prefix
// length at which an answer embeds 192.0.0.170 or 192.0.0.171. The
// well-known prefix is left out (Classify knows it).
func PrefixesFromIPv4Only(aaaa []netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range aaaa {
		if !a.Is6() || a.Is4In6() || nat64WellKnown.Contains(a) {
			continue
		}
		for _, bits := range []int{96, 64, 56, 48, 40, 32} {
			v4, _ := Extract6052(a, bits)
			if !slices.Contains(ipv4onlyAddrs, v4) {
				continue
			}
			if pr, err := a.Prefix(bits); err == nil && !slices.Contains(out, pr) {
				out = append(out, pr)
			}
		}
	}
	return out
}
