package netclass

import (
	"net/netip"
	"testing"
)

// TestNetworkSpecificNAT64: with the host network's NAT64 prefix known, an
// address under it is refused exactly when the IPv4 address it embeds would
// be (private, loopback, metadata, the host's own), at every RFC 6052
// prefix length; without it such an address is an ordinary public one.
func TestNetworkSpecificNAT64(t *testing.T) {
	nsp := map[int]string{96: "2a01:4f8:c2c:123f:64::/96", 64: "2a01:4f8:c2c:1234::/64", 56: "2a01:4f8:c2c:1200::/56",
		48: "2a01:4f8:c2c::/48", 40: "2a01:4f8:c2::/40", 32: "2a01:4f8::/32"}
	for bits, ps := range nsp {
		pr := netip.MustParsePrefix(ps).Masked()
		embed := func(v4 string) netip.Addr {
			b := pr.Addr().As16()
			off := v4Bytes[bits]
			a4 := netip.MustParseAddr(v4).As4()
			for i := range 4 {
				b[off[i]] = a4[i]
			}
			return netip.AddrFrom16(b)
		}
		if got, _ := Extract6052(embed("10.1.2.3"), bits); got != netip.MustParseAddr("10.1.2.3") {
			t.Fatalf("/%d: Extract6052 = %v", bits, got)
		}
		var n NAT64
		n.Set([]netip.Prefix{pr})
		p := New(Options{NAT64: &n, Host: []netip.Addr{netip.MustParseAddr("93.184.0.9")}})
		plain := New(Options{})
		for v4, want := range map[string]Class{"10.1.2.3": Private, "127.0.0.1": Loopback, "169.254.169.254": Metadata,
			"192.168.7.7": Private, "93.184.0.9": HostAddress, "8.8.8.8": Public} {
			a := embed(v4)
			if got := p.Check(a); got != want {
				t.Errorf("/%d: Check(%s, embedding %s) = %s, want %s", bits, a, v4, got, want)
			}
			if want != Metadata && want != HostAddress {
				if got := plain.Check(a); got != Public {
					t.Errorf("/%d: without the prefix Check(%s) = %s, want public", bits, a, got)
				}
			}
		}
		// RFC 7050 discovery finds the prefix from the synthesised answer.
		got := PrefixesFromIPv4Only([]netip.Addr{embed("192.0.0.170"), embed("192.0.0.171")})
		found := false
		for _, g := range got {
			if g == pr {
				found = true
			}
		}
		if !found {
			t.Errorf("/%d: PrefixesFromIPv4Only = %v, want it to hold %s", bits, got, pr)
		}
	}
	if got := PrefixesFromIPv4Only([]netip.Addr{netip.MustParseAddr("64:ff9b::c000:aa"), netip.MustParseAddr("2606:4700::1")}); len(got) != 0 {
		t.Errorf("PrefixesFromIPv4Only of the well-known prefix and an unrelated address = %v, want none", got)
	}
}
