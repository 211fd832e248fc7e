package netclass

import (
	"net/netip"
	"strconv"
	"strings"
)

// IsReverseName reports whether n, a normalised name, lies in the
// reverse-mapping trees (in-addr.arpa, ip6.arpa).
func IsReverseName(n string) bool {
	return n == "in-addr.arpa" || n == "ip6.arpa" || strings.HasSuffix(n, ".in-addr.arpa") || strings.HasSuffix(n, ".ip6.arpa")
}

// ReversePublic reports whether a reverse-mapping name may be asked about
// upstream: only a complete address whose class is public, and, when p is
// set, that p calls public too (not one of the host's own addresses, its
// IPv6 LAN or an instance network, nor a private range opened with
// --allow-private). Partial names (zone cuts such as 10.in-addr.arpa),
// classless-delegation forms and anything unparseable are not, so no query
// about private ranges or the host's network reaches the host's resolvers,
// which may know the LAN's names.
func ReversePublic(n string, p *Policy) bool {
	a, ok := ReverseAddr(n)
	return ok && Classify(a) == Public && (p == nil || p.Check(a) == Public)
}

// ReverseAddr parses a complete reverse-mapping name (under in-addr.arpa or
// ip6.arpa, as NormalizeName returns it) into its address; partial names,
// classless-delegation forms and anything else do not parse.
func ReverseAddr(n string) (netip.Addr, bool) {
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
