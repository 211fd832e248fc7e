//go:build e2e

package hostfw

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// linkLocalSender sends three IPv4/UDP datagrams from argv[3] to
// argv[4]:argv[5], payload argv[6]-MAC, in frames addressed to the
// Ethernet address argv[2], out of the interface argv[1] (a raw socket: no
// ARP, any MAC).
const linkLocalSender = `import socket, struct, sys
dev, dstmac, src, dst, port, tag = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
mac = bytes.fromhex(open('/sys/class/net/%s/address' % dev).read().strip().replace(':', ''))
data = (tag + '-' + dstmac.replace(':', '')).encode()
udp = struct.pack('!HHHH', 40000, port, 8 + len(data), 0) + data
def csum(b):
    t = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    while t >> 16:
        t = (t & 0xffff) + (t >> 16)
    return ~t & 0xffff
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, socket.inet_aton(src), socket.inet_aton(dst))
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
for i in range(3):
    s.send(bytes.fromhex(dstmac.replace(':', '')) + mac + b'\x08\x00' + ip + udp)
`

// TestE2ELinkLocalGroupMACsNeedThePortDrops: frames to the IEEE
// link-local group addresses 01:80:c2:00:00:02 to 0f are not bridged: the
// kernel hands them to the host's own stack on the port device (the tap),
// past ebtables' nat PREROUTING, where the nwfilter's layer-2 rules are,
// and with the tap, not the bridge, as the input interface, so the
// bridge's input chain does not see them either. A guest that addresses
// IPv4 to such a MAC reaches every host port (here 9999 on the gateway,
// which neither layer allows). Only the drops EnsurePort puts on the tap
// (INPUT -i TAP) stop it; the control shows the hole without them.
func TestE2ELinkLocalGroupMACsNeedThePortDrops(t *testing.T) {
	l := newLimitsLab(t)
	need.Program(t, "ebtables")
	ctx := context.Background()
	const guestMAC = "52:54:00:aa:bb:02"
	tapMAC, err := TapMAC(guestMAC)
	if err != nil {
		t.Fatal(err)
	}
	l.in(l.host, "ip", "link", "set", "dev", "vl1", "address", tapMAC)
	l.in(l.host, "ip", "link", "set", "dev", limBridge, "address", "52:54:00:aa:bb:fe")
	l.in(l.guest, "ip", "link", "set", "dev", "vl0", "address", guestMAC)
	// What the nwfilter's last layer-2 rule on the guest's port does.
	l.in(l.host, "ebtables", "-t", "nat", "-A", "PREROUTING", "-i", "vl1", "-j", "DROP")
	fw := New(nsRunner{l.host})
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	heard := l.udpListener("0.0.0.0", 9999)
	macs := []string{"01:80:c2:00:00:02", "01:80:c2:00:00:03", "01:80:c2:00:00:0e"}
	reached := func(tag string) []string {
		for _, m := range macs {
			l.in(l.guest, "python3", "-c", linkLocalSender, "vl0", m, limGuest, limGW, "9999", tag)
		}
		time.Sleep(500 * time.Millisecond)
		var got []string
		for _, m := range macs {
			if w := tag + "-" + strings.ReplaceAll(m, ":", ""); strings.Contains(heard.String(), w) {
				got = append(got, m)
			}
		}
		return got
	}
	if got := reached("before"); len(got) == 0 {
		t.Fatal("control: with the port's ebtables drop and the bridge's chains but no tap drops, no link-local frame reached the host; the test proves nothing")
	} else {
		t.Logf("without the tap drops the guest reached host port 9999 through %v", got)
	}
	if err := fw.EnsurePort(ctx, Port{Bridge: limBridge, GuestMAC: guestMAC}); err != nil {
		t.Fatal(err)
	}
	if got := reached("after"); len(got) != 0 {
		t.Errorf("with EnsurePort's tap drops the guest still reached host port 9999 through %v", got)
	}
}
