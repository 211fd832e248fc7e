//go:build e2e

package hostfw

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestE2ESpoofedSourceDropped: a guest without its nwfilter (whose
// layer-2 rules are what normally refuse other sources) sends the
// gateway's DNS port datagrams "from" a LAN host's address. Without the
// chains the host's listener gets them (and would answer the LAN host);
// with them only the guest's own address gets through.
func TestE2ESpoofedSourceDropped(t *testing.T) {
	l := newLimitsLab(t)
	const lanHost = "192.168.77.5"
	// The host's LAN, so that the spoofed source is one the host routes
	// elsewhere (and loose reverse-path filtering passes it).
	l.sh("ip", "-n", l.host, "link", "add", "lan0", "type", "veth", "peer", "name", "lan1")
	l.sh("ip", "-n", l.host, "addr", "add", "192.168.77.1/24", "dev", "lan0")
	l.sh("ip", "-n", l.host, "link", "set", "lan0", "up")
	l.sh("ip", "-n", l.host, "link", "set", "lan1", "up")
	for _, k := range []string{"all", "default", limBridge} {
		l.in(l.host, "sysctl", "-qw", "net.ipv4.conf."+k+".rp_filter=0")
	}
	// The guest claims the LAN host's address as well as its own.
	l.in(l.guest, "ip", "addr", "add", lanHost+"/32", "dev", "vl0")

	// A UDP listener on the gateway's DNS port that prints every source.
	out := l.udpListener(limGW, 53)
	send := func(from, tag string) {
		l.in(l.guest, "python3", "-c", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"+
			"s.bind(('"+from+"', 0))\nfor i in range(3):\n    s.sendto(b'"+tag+"', ('"+limGW+"', 53))\n")
	}
	got := func(from, tag string) bool {
		for i := 0; i < 10; i++ {
			if strings.Contains(out.String(), from+" "+tag) {
				return true
			}
			time.Sleep(100 * time.Millisecond)
		}
		return false
	}

	send(lanHost, "before")
	send(limGuest, "before")
	if !got(lanHost, "before") || !got(limGuest, "before") {
		t.Fatalf("control: without the chains the listener did not get both sources; the test proves nothing:\n%s", out.String())
	}
	fw := New(nsRunner{l.host})
	if err := fw.Ensure(context.Background(), Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}); err != nil {
		t.Fatal(err)
	}
	send(lanHost, "after")
	send(limGuest, "after")
	if !got(limGuest, "after") {
		t.Errorf("with the chains the guest's own address no longer reaches the DNS port:\n%s", out.String())
	}
	if got(lanHost, "after") {
		t.Errorf("with the chains a datagram from the spoofed source %s reached the host's listener:\n%s", lanHost, out.String())
	}
}
