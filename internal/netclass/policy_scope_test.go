package netclass

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestMetadataRefusedInEveryForm: every cloud's metadata and platform
// endpoints classify as metadata, in IPv4, mapped, compatible, NAT64, 6to4
// and Teredo forms, and no permit (--allow-private or --allow-host, however
// wide) opens them. Azure's wireserver is a public address, so nothing but
// this class refuses it.
func TestMetadataRefusedInEveryForm(t *testing.T) {
	wide := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	p := New(Options{Permit: wide, PermitHost: wide})
	for _, v4 := range []string{"169.254.42.42", "169.254.169.254", "169.254.169.253", "169.254.169.123", "169.254.170.2", "169.254.0.23", "168.63.129.16", "100.100.100.200", "192.0.0.192"} {
		a := netip.MustParseAddr(v4)
		b := a.As4()
		forms := []string{
			v4,
			"::ffff:" + v4,
			"::" + v4,
			netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 10: 0, 11: 0, 12: b[0], 13: b[1], 14: b[2], 15: b[3]}).String(),
			netip.AddrFrom16([16]byte{0x20, 0x02, b[0], b[1], b[2], b[3], 15: 1}).String(),
			// Teredo with the endpoint as its server, and as its (inverted) client.
			netip.AddrFrom16([16]byte{0x20, 0x01, 0, 0, b[0], b[1], b[2], b[3], 15: 1}).String(),
			netip.AddrFrom16([16]byte{0x20, 0x01, 0, 0, 8, 8, 8, 8, 12: ^b[0], 13: ^b[1], 14: ^b[2], 15: ^b[3]}).String(),
		}
		for _, f := range forms {
			ad := netip.MustParseAddr(f)
			if got := Classify(ad); got != Metadata {
				t.Errorf("Classify(%s) (%s) = %s, want metadata", f, v4, got)
			}
			if got := p.Check(ad); got != Metadata {
				t.Errorf("permit-everything Check(%s) (%s) = %s, want metadata", f, v4, got)
			}
		}
	}
	for _, v6 := range []string{"fd00:ec2::254", "fd00:ec2::23", "fd20:ce::254", "fd00:c1::a9fe:a9fe", "fd00:42::42", "fe80::a9fe:a9fe", "fe80::a9fe:a9fe%eth0"} {
		if got := p.Check(netip.MustParseAddr(v6)); got != Metadata {
			t.Errorf("Check(%s) = %s, want metadata", v6, got)
		}
	}
}

// TestSpecialPurposeRegistriesCovered: one address of every block in the
// IANA IPv4 and IPv6 Special-Purpose Address Registries (as of 2025, RFC
// 6890 and successors), including the globally reachable anycast ones (AS112,
// AMT, PCP, TURN) is refused. 2001:3::/32 (AMT) and the ORCHIDs sit in
// 2001::/23.
func TestSpecialPurposeRegistriesCovered(t *testing.T) {
	blocks := []string{
		"0.0.0.0/8", "0.0.0.0/32", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
		"172.16.0.0/12", "192.0.0.0/24", "192.0.0.0/29", "192.0.0.8/32", "192.0.0.9/32", "192.0.0.10/32",
		"192.0.0.170/32", "192.0.0.171/32", "192.0.2.0/24", "192.31.196.0/24", "192.52.193.0/24",
		"192.88.99.0/24", "192.168.0.0/16", "192.175.48.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32", "224.0.0.0/4",
		"::1/128", "::/128", "::ffff:0:0/96", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "100:0:0:1::/64",
		"2001::/23", "2001::/32", "2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:2::/48",
		"2001:3::/32", "2001:4:112::/48", "2001:10::/28", "2001:20::/28", "2001:30::/28", "2001:db8::/32",
		"2002::/16", "2620:4f:8000::/48", "3fff::/20", "5f00::/16", "fc00::/7", "fe80::/10", "ff00::/8",
	}
	p := NewPolicy(nil, nil)
	for _, b := range blocks {
		pr := netip.MustParsePrefix(b)
		first := pr.Addr()
		last := lastAddr(pr)
		for _, a := range []netip.Addr{first, last} {
			if c := p.Check(a); Allowed(c) {
				t.Errorf("%s (block %s) = %s, want refused", a, b, c)
			}
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestPermitNeverOpensTheHost: --allow-private, however wide, opens private
// ranges but never the host's own addresses, loopback or the networks of
// abox bridges (other guests); --allow-host opens those explicitly.
func TestPermitNeverOpensTheHost(t *testing.T) {
	now := time.Unix(1000, 0)
	oldAddrs, oldBridges, oldClock := interfaceAddrs, bridgeAddrs, clock
	t.Cleanup(func() { interfaceAddrs, bridgeAddrs, clock = oldAddrs, oldBridges, oldClock })
	cidr := func(s string) net.Addr {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip
		return n
	}
	bridges := []net.Addr{cidr("10.10.7.1/24"), cidr("10.10.8.1/24")}
	interfaceAddrs = func() ([]net.Addr, error) {
		return append([]net.Addr{cidr("127.0.0.1/8"), cidr("192.168.1.20/24")}, bridges...), nil
	}
	bridgeAddrs = func() ([]net.Addr, error) { return bridges, nil }
	clock = func() time.Time { return now }

	host := []netip.Addr{netip.MustParseAddr("10.10.7.1")}
	wide := New(Options{Permit: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("127.0.0.0/8")}, Host: host})
	for _, tt := range []struct {
		addr string
		want Class
	}{
		{"10.20.0.5", Permitted},       // a private service the user meant
		{"192.168.1.30", Permitted},    // a LAN neighbour
		{"192.168.1.20", HostAddress},  // the host itself
		{"10.10.7.1", HostAddress},     // this instance's gateway
		{"10.10.8.2", Instance},        // another guest
		{"::ffff:10.10.8.2", Instance}, // the same, mapped
		{"127.0.0.1", Loopback},
		{"0.0.0.0", Unspecified},
	} {
		if got := wide.Check(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("--allow-private: Check(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
	explicit := New(Options{PermitHost: []netip.Prefix{netip.MustParsePrefix("10.10.8.0/24"), netip.MustParsePrefix("127.0.0.1/32")}, Host: host})
	for _, tt := range []struct {
		addr string
		want Class
	}{
		{"10.10.8.2", Permitted},
		{"127.0.0.1", Permitted},
		{"127.0.0.2", Loopback},
		{"10.10.7.1", HostAddress},
		{"10.20.0.5", Private},
	} {
		if got := explicit.Check(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("--allow-host: Check(%s) = %s, want %s", tt.addr, got, tt.want)
		}
	}
}

func TestParsePermit(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    string
		warn    bool
		wantErr bool
	}{
		{in: "10.20.0.0/16", want: "10.20.0.0/16"},
		{in: "10.20.3.4/16", want: "10.20.0.0/16"},
		{in: "10.20.3.4", want: "10.20.3.4/32"},
		{in: "::ffff:10.20.3.4", want: "10.20.3.4/32"},
		{in: "fd00:1:2::/48", want: "fd00:1:2::/48"},
		{in: "10.0.0.0/8", want: "10.0.0.0/8", warn: true},
		{in: "fd00::/8", want: "fd00::/8", warn: true},
		{in: "0.0.0.0/0", wantErr: true},
		{in: "::/0", wantErr: true},
		{in: "::ffff:0:0/96", wantErr: true},
		{in: "10.0.0.0/33", wantErr: true},
		{in: "intranet", wantErr: true},
		{in: "fe80::1%eth0", wantErr: true},
	} {
		p, warn, err := ParsePermit("--allow-private", tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParsePermit(%q) error %v, want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		if p.String() != tt.want || (warn != "") != tt.warn {
			t.Errorf("ParsePermit(%q) = %s, warning %q; want %s, warning %v", tt.in, p, warn, tt.want, tt.warn)
		}
	}
}
