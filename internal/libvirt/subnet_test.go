package libvirt

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func prefixes(ss ...string) []netip.Prefix {
	var r []netip.Prefix
	for _, s := range ss {
		r = append(r, netip.MustParsePrefix(s))
	}
	return r
}

func TestAllocateSubnet(t *testing.T) {
	tests := []struct {
		name    string
		pool    string
		used    []netip.Prefix
		want    string
		wantErr string
	}{
		{"empty pool", "10.10.0.0/16", nil, "10.10.0.0/24", ""},
		{"skips used", "10.10.0.0/16", prefixes("10.10.0.0/24", "10.10.1.0/24"), "10.10.2.0/24", ""},
		{"skips a host route covering several", "10.10.0.0/16", prefixes("10.10.0.0/23", "10.10.2.128/25"), "10.10.3.0/24", ""},
		{"host address", "10.10.0.0/16", prefixes("10.10.0.7/32"), "10.10.1.0/24", ""},
		{"unmasked pool", "10.10.9.9/16", nil, "10.10.0.0/24", ""},
		{"never libvirt default", "192.168.122.0/23", nil, "192.168.123.0/24", ""},
		{"only libvirt default", "192.168.122.0/24", nil, "", "every /24"},
		{"broad route takes the pool", "10.10.0.0/16", prefixes("10.0.0.0/8"), "", "every /24"},
		{"carry into second octet", "10.10.0.0/15", prefixes("10.10.0.0/16"), "10.11.0.0/24", ""},
		{"ipv6 used ignored", "10.10.0.0/16", prefixes("fd00::/8"), "10.10.0.0/24", ""},
		{"pool too small", "10.10.0.0/25", nil, "", "/24 or larger"},
		{"ipv6 pool", "fd00::/48", nil, "", "IPv4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AllocateSubnet(netip.MustParsePrefix(tt.pool), tt.used)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("AllocateSubnet = %v, %v; want error containing %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.String() != tt.want {
				t.Fatalf("AllocateSubnet = %v, %v; want %s", got, err, tt.want)
			}
		})
	}
}

// TestAllocateSubnetExhaustive fills the default pool one by one and
// checks that no answer ever overlaps an earlier one or libvirt's default.
func TestAllocateSubnetExhaustive(t *testing.T) {
	pool := netip.MustParsePrefix(DefaultSubnetPool)
	var used []netip.Prefix
	for i := 0; i < 256; i++ {
		got, err := AllocateSubnet(pool, used)
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if overlapsAny(got, used) || got.Overlaps(netip.MustParsePrefix(LibvirtDefaultSubnet)) || !pool.Contains(got.Addr()) {
			t.Fatalf("allocation %d = %v overlaps a used prefix or leaves the pool", i, got)
		}
		used = append(used, got)
	}
	if _, err := AllocateSubnet(pool, used); err == nil {
		t.Fatal("257th allocation from a /16 succeeded")
	}
}

func TestInstanceAddresses(t *testing.T) {
	gw, guest := InstanceAddresses(netip.MustParsePrefix("10.10.7.0/24"))
	if gw.String() != "10.10.7.1" || guest.String() != "10.10.7.10" {
		t.Errorf("InstanceAddresses = %v, %v", gw, guest)
	}
}

type fakeRunner struct {
	out  string
	err  error
	args []string
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	f.args = append([]string{name}, args...)
	return []byte(f.out), f.err
}

func TestHostRoutes(t *testing.T) {
	r := &fakeRunner{out: `[{"dst":"default","gateway":"192.0.2.1","dev":"eth0"},
{"dst":"192.0.2.0/24","dev":"eth0"},
{"type":"local","dst":"127.0.0.0/8","dev":"lo","table":"local"},
{"type":"local","dst":"10.10.3.1","dev":"abx-1","table":"local"},
{"dst":"0.0.0.0/0","table":"100"},
{"type":"unreachable","dst":"10.10.8.0/22","table":"200"}]`}
	got, err := HostRoutes(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	want := prefixes("192.0.2.0/24", "127.0.0.0/8", "10.10.3.1/32", "10.10.8.0/22")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HostRoutes = %v, want %v", got, want)
	}
	if strings.Join(r.args, " ") != "ip -j -4 route show table all" {
		t.Errorf("ran %q", r.args)
	}
	sub, err := AllocateSubnet(netip.MustParsePrefix("10.10.0.0/16"), append(got, prefixes("10.10.0.0/24")...))
	if err != nil || sub.String() != "10.10.1.0/24" {
		t.Errorf("allocation after routes = %v, %v", sub, err)
	}

	failing := &fakeRunner{err: errors.New("boom")}
	if _, err := HostRoutes(context.Background(), failing); err == nil {
		t.Error("runner failure not reported")
	}
	garbage := &fakeRunner{out: `[{"dst":"nonsense/99"}]`}
	if _, err := HostRoutes(context.Background(), garbage); err == nil {
		t.Error("bad route not reported")
	}
}

func TestHostRoutesReal(t *testing.T) {
	if _, err := (ExecRunner{}).Run(context.Background(), "ip", "-V"); err != nil {
		t.Skip("ip(8) not available")
	}
	routes, err := HostRoutes(context.Background(), ExecRunner{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range routes {
		if p.Bits() == 0 {
			t.Errorf("default route %v returned", p)
		}
	}
}

func TestParseNetworkInfo(t *testing.T) {
	info, err := parseNetworkInfo(`<network><name>default</name><bridge name='virbr0'/>
<ip address='192.168.122.1' netmask='255.255.255.0'/><ip family='ipv6' address='fd00::1' prefix='64'/></network>`)
	if err != nil {
		t.Fatal(err)
	}
	want := NetworkInfo{Name: "default", Bridge: "virbr0", Subnets: prefixes("192.168.122.0/24", "fd00::/64")}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("parseNetworkInfo = %+v, want %+v", info, want)
	}
}
