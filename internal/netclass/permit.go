package netclass

import (
	"fmt"
	"net/netip"
)

// Widest ranges a permit may name without a warning: a /16 of IPv4 or a /48
// of IPv6 is a site; anything wider usually means "let everything private
// through", which the filters exist to prevent.
const (
	wideBits4 = 16
	wideBits6 = 48
)

// ParsePermit parses one --allow-private or --allow-host value (flag names
// it in errors): a CIDR, or one address meaning just that address. A /0 is
// refused: it would permit every range, and an address range is not a way to
// turn the filter off. A range wider than a /16 (IPv4) or /48 (IPv6) is
// accepted with a warning to show the user.
func ParsePermit(flag, s string) (p netip.Prefix, warning string, err error) {
	p, err = netip.ParsePrefix(s)
	if err != nil {
		a, aerr := netip.ParseAddr(s)
		if aerr != nil || a.Zone() != "" {
			return netip.Prefix{}, "", fmt.Errorf("%s %q: not a CIDR (write for example 10.20.0.0/16 or fd00::/8)", flag, s)
		}
		p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
	}
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
	}
	p = p.Masked()
	if p.Bits() == 0 {
		return netip.Prefix{}, "", fmt.Errorf("%s %q: a /0 would permit every address; name the network the guest needs, such as 10.20.0.0/16", flag, s)
	}
	if w := wideBits4; p.Addr().Is4() && p.Bits() < w || p.Addr().Is6() && p.Bits() < wideBits6 {
		if p.Addr().Is6() {
			w = wideBits6
		}
		warning = fmt.Sprintf("%s %s is wider than a /%d: every private service in it becomes reachable from the guest; name the networks it needs", flag, p, w)
	}
	return p, warning, nil
}
