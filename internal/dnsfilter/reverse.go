package dnsfilter

import (
	"net/netip"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/netclass"
)

// reverseForwardable reports whether a reverse-mapping name (under
// in-addr.arpa or ip6.arpa) may go upstream: only a complete address whose
// class is public and that the address policy p calls public too, so not
// one of the host's own addresses, an address on the host's IPv6 LAN or on
// another instance's network, and not a private range opened with
// --allow-private. Partial names (zone cuts such as 10.in-addr.arpa),
// classless-delegation forms and anything unparseable stay local, so no
// query about private ranges or the host's network ever reaches the host's
// resolvers, which may know the LAN's names.
func reverseForwardable(n string, p *netclass.Policy) bool {
	a, ok := reverseAddr(n)
	return ok && netclass.Classify(a) == netclass.Public && p.Check(a) == netclass.Public
}

// reverseAddr parses a complete reverse-mapping name into its address.
func reverseAddr(n string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(n, ".in-addr.arpa"); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 4 {
			return netip.Addr{}, false
		}
		var b [4]byte
		for i, l := range labels {
			v, err := strconv.ParseUint(l, 10, 8)
			if err != nil || strconv.FormatUint(v, 10) != l {
				return netip.Addr{}, false
			}
			b[3-i] = byte(v)
		}
		return netip.AddrFrom4(b), true
	}
	if rest, ok := strings.CutSuffix(n, ".ip6.arpa"); ok {
		labels := strings.Split(rest, ".")
		if len(labels) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, l := range labels {
			if len(l) != 1 {
				return netip.Addr{}, false
			}
			v, err := strconv.ParseUint(l, 16, 8)
			if err != nil {
				return netip.Addr{}, false
			}
			pos := 31 - i // nibble index from the most significant end
			if pos%2 == 0 {
				b[pos/2] |= byte(v) << 4
			} else {
				b[pos/2] |= byte(v)
			}
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}
