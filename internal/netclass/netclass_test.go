package netclass

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		addr string
		want Class
	}{
		{"0.0.0.0", Unspecified}, {"0.255.1.2", Unspecified},
		{"10.0.0.1", Private}, {"172.16.0.1", Private}, {"172.31.255.255", Private}, {"192.168.1.1", Private},
		{"172.32.0.1", Public}, {"172.15.255.255", Public},
		{"100.64.0.1", CGNAT}, {"100.127.255.255", CGNAT}, {"100.128.0.1", Public},
		{"127.0.0.1", Loopback}, {"127.255.255.254", Loopback},
		{"169.254.169.254", Metadata}, {"169.254.1.1", LinkLocal},
		{"192.0.0.1", IETFProtocol}, {"192.0.0.170", IETFProtocol},
		{"192.0.2.1", Documentation}, {"198.51.100.1", Documentation}, {"203.0.113.1", Documentation},
		{"192.88.99.1", Relay6to4},
		{"198.18.0.1", Benchmarking}, {"198.19.255.255", Benchmarking}, {"198.20.0.1", Public},
		{"224.0.0.1", Multicast}, {"239.255.255.255", Multicast},
		{"240.0.0.1", Reserved}, {"255.255.255.254", Reserved}, {"255.255.255.255", Broadcast},
		{"8.8.8.8", Public}, {"1.1.1.1", Public},
		{"::", Unspecified}, {"::1", Loopback},
		{"fe80::1", LinkLocal}, {"fe80::1%eth0", LinkLocal}, {"febf::1", LinkLocal},
		{"fc00::1", UniqueLocal}, {"fd12:3456::1", UniqueLocal}, {"fec0::1", UniqueLocal},
		{"ff02::1", Multicast}, {"ff0e::1", Multicast},
		{"2001:db8::1", Documentation}, {"3fff::1", Documentation},
		{"2001:2::1", Benchmarking}, {"2001:1::1", IETFProtocol}, {"2001:0:0:1::", Unspecified},
		{"100::1", Reserved}, {"4000::1", Reserved},
		{"2606:4700::1111", Public}, {"2a00:1450::1", Public},
		// IPv4-mapped
		{"::ffff:127.0.0.1", Loopback}, {"::ffff:10.1.2.3", Private}, {"::ffff:169.254.169.254", Metadata}, {"::ffff:8.8.8.8", Public},
		// IPv4-compatible (deprecated)
		{"::127.0.0.1", Loopback}, {"::10.0.0.1", Private}, {"::8.8.8.8", Public},
		// NAT64 well-known and local-use
		{"64:ff9b::7f00:1", Loopback}, {"64:ff9b::a9fe:a9fe", Metadata}, {"64:ff9b::a9fe:101", LinkLocal}, {"64:ff9b::808:808", Public},
		{"64:ff9b:1::1", Embedded}, {"64:ff9b:1:ffff::8.8.8.8", Embedded},
		// 6to4
		{"2002:7f00:1::1", Loopback}, {"2002:c0a8:101::1", Private}, {"2002:808:808::1", Public},
		// Teredo: server 8.8.8.8 (public), client inverted
		{"2001:0:808:808::80ff:fffe", Loopback}, // client ^0x80fffffe = 127.0.0.1
		{"2001:0:808:808::f5ff:fffe", Private},  // client 10.0.0.1
		{"2001:0:a00:1::f7f7:f7f7", Private},    // server 10.0.0.1
		{"2001:0:808:808::f7f7:f7f7", Public},   // client 8.8.8.8
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := Classify(netip.MustParseAddr(tt.addr)); got != tt.want {
				t.Errorf("Classify(%s) = %s, want %s", tt.addr, got, tt.want)
			}
		})
	}
	if got := Classify(netip.Addr{}); got != Invalid {
		t.Errorf("Classify(zero) = %s, want invalid", got)
	}
}

func TestPolicyCheck(t *testing.T) {
	p := NewPolicy(
		[]netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.20.0.0/16")},
		[]netip.Addr{netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("93.184.1.1"), netip.MustParseAddr("2a00::5")},
	)
	tests := []struct {
		addr string
		want Class
	}{
		// --allow-private never opens loopback, even when it names it.
		{"127.0.0.1", Loopback},
		{"::ffff:127.0.0.1", Loopback},
		{"64:ff9b::7f00:1", Loopback},
		{"127.0.0.2", Loopback},
		{"10.20.3.4", Permitted},
		{"10.21.0.1", Private},
		{"93.184.1.1", HostAddress},
		{"::ffff:93.184.1.1", HostAddress},
		{"64:ff9b::5db8:101", HostAddress},
		{"2002:5db8:101::1", HostAddress},
		{"2a00::5", HostAddress},
		{"2a00::5%eth0", HostAddress},
		{"93.184.1.2", Public},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := p.Check(netip.MustParseAddr(tt.addr)); got != tt.want {
				t.Errorf("Check(%s) = %s, want %s", tt.addr, got, tt.want)
			}
		})
	}
	var zero *Policy
	if got := zero.Check(netip.MustParseAddr("10.0.0.1")); got != Private {
		t.Errorf("nil policy Check(10.0.0.1) = %s, want private", got)
	}
}

// FuzzClassify checks that an address carrying an IPv4 address is never
// more reachable than that address, and that zones never change a class.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::", "2001:0:808:808::80ff:fffe", "fe80::1", "8.8.8.8"} {
		a := netip.MustParseAddr(s).As16()
		f.Add(a[:])
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) != 16 && len(b) != 4 {
			return
		}
		a, _ := netip.AddrFromSlice(b)
		c := Classify(a)
		if c == Invalid || c == Permitted || c == HostAddress {
			t.Fatalf("Classify(%v) = %s: not a class Classify may return", a, c)
		}
		if v4, ok := Embedded4(a); ok && Classify(v4) != Public && c == Public {
			t.Fatalf("Classify(%v) = public but it embeds %v (%s)", a, v4, Classify(v4))
		}
		if a.Is6() {
			if z := Classify(a.WithZone("eth0")); z != c {
				t.Fatalf("zone changed class of %v: %s vs %s", a, c, z)
			}
		}
		if a.Is4() {
			if m := Classify(netip.AddrFrom16(a.As16())); m != c {
				t.Fatalf("mapped form of %v classifies %s, want %s", a, m, c)
			}
		}
	})
}

// TestPolicyFollowsHostInterfaces: a host policy refuses the IPv6 networks
// the host's interfaces sit on (a LAN neighbour with a global IPv6 address,
// and the site's other subnets: the /56 around a global interface prefix)
// and addresses the host gains after start (IPv6 temporary addresses rotate
// daily, DHCP renumbers). A public IPv4 subnet is a server's uplink (and the
// e2e lab's "internet"): its neighbours stay reachable.
func TestPolicyFollowsHostInterfaces(t *testing.T) {
	now := time.Unix(1000, 0)
	var ifaces []net.Addr
	setIfaces := func(cidrs ...string) {
		ifaces = nil
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				t.Fatal(err)
			}
			n.IP = ip
			ifaces = append(ifaces, n)
		}
	}
	oldAddrs, oldClock := interfaceAddrs, clock
	interfaceAddrs = func() ([]net.Addr, error) { return ifaces, nil }
	clock = func() time.Time { return now }
	t.Cleanup(func() { interfaceAddrs, clock = oldAddrs, oldClock })

	setIfaces("127.0.0.1/8", "10.1.2.1/24", "198.51.100.7/24", "2a02:1234:5678:9abc::10/64", "203.0.113.9/32", "fe80::1/64")
	p := NewPolicy([]netip.Prefix{netip.MustParsePrefix("2a02:1234:5678:9abc::443/128")}, []netip.Addr{netip.MustParseAddr("10.1.2.1")})
	for _, tt := range []struct {
		addr string
		want Class
	}{
		{"2a02:1234:5678:9abc::10", HostAddress},
		{"2a02:1234:5678:9abc::99", HostNetwork}, // LAN neighbour, global IPv6
		{"2a02:1234:5678:9abc::443", Permitted},
		{"2a02:1234:5678:9abd::1", HostNetwork}, // another subnet of the site's /56
		{"2a02:1234:5678:9aff::1", HostNetwork}, // the site's last /64
		{"2a02:1234:5678:9b00::1", Public},      // past the /56
		{"2a02:1234:5678:9900::1", Public},      // before it
		{"93.184.1.1", Public},
		{"::ffff:93.184.1.1", Public},
	} {
		if got := p.Check(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Check(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
	// The host gains an address and a subnet after the policy was built.
	setIfaces("127.0.0.1/8", "10.1.2.1/24", "93.184.1.1/24", "2a02:1234:5678:aaaa::5/64")
	now = now.Add(2 * hostRefresh)
	for _, tt := range []struct {
		addr string
		want Class
	}{
		{"93.184.1.1", HostAddress},
		{"::ffff:93.184.1.1", HostAddress},
		{"2002:5db8:101::1", HostAddress},
		{"93.184.1.77", Public}, // an IPv4 uplink's neighbour
		{"2a02:1234:5678:aaaa::5", HostAddress},
		{"2a02:1234:5678:aaaa::6", HostNetwork},
		{"2a02:1234:5678:9abc::99", Public}, // that interface is gone (9a00::/56 with it)
	} {
		if got := p.Check(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("after change: Check(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
	// A policy without host addresses (tests, the default) reads nothing.
	if got := NewPolicy(nil, nil).Check(netip.MustParseAddr("93.184.1.77")); got != Public {
		t.Errorf("plain policy Check = %s, want public", got)
	}
}
