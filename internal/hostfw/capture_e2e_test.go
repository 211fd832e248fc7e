//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/syncbuf"
)

// captureListener stands in for the proxy's capture servers: on the
// gateway's capture ports it answers each connection with the port it
// arrived on and the destination the guest had chosen (SO_ORIGINAL_DST).
const captureListener = `import select, socket, struct, sys
ls = []
for p in (int(sys.argv[2]), int(sys.argv[3])):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], p))
    s.listen(16)
    ls.append(s)
print("listening", flush=True)
while True:
    r, _, _ = select.select(ls, [], [])
    for s in r:
        c, a = s.accept()
        d = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST
        msg = "captured %s:%d on %d" % (socket.inet_ntoa(d[4:8]), struct.unpack("!H", d[2:4])[0], s.getsockname()[1])
        print(msg, a[0], flush=True)
        c.sendall(msg.encode())
        c.close()
`

// captureProbe connects from the guest and prints what it read, or what
// became of the connection ("refused", "timeout").
const captureProbe = `import errno, socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print(s.recv(200).decode() or "closed")
except socket.timeout:
    print("timeout")
except OSError as e:
    print({errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable"}.get(e.errno, str(e)))
`

// TestE2ECaptureDNAT: with capture on, the guest's TCP to port 443 and
// 80 of a remote address arrives at the gateway's capture ports (the
// original destination known there), through the answer table and the
// input chain; its TCP to the gateway's own 443 is not captured and is
// refused. Without the capture chain, on a host that forwards packets
// and has a route to the remote address, the same flows reach nothing:
// the FORWARD chain drops them.
func TestE2ECaptureDNAT(t *testing.T) {
	l := newLimitsLab(t)
	ctx := context.Background()
	const remote = "198.51.100.7"
	l.sh("ip", "-n", l.guest, "route", "add", "default", "via", limGW)
	// A "remote" namespace behind the host, with a listener on 443 that
	// must never hear the guest.
	far := fmt.Sprintf("abx-fwlr-%d", os.Getpid())
	l.sh("ip", "netns", "add", far)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", far).Run() })
	l.sh("ip", "link", "add", "vr0", "netns", far, "type", "veth", "peer", "name", "vr1", "netns", l.host)
	l.sh("ip", "-n", far, "addr", "add", remote+"/24", "dev", "vr0")
	l.sh("ip", "-n", far, "link", "set", "vr0", "up")
	l.sh("ip", "-n", l.host, "addr", "add", "198.51.100.1/24", "dev", "vr1")
	l.sh("ip", "-n", l.host, "link", "set", "vr1", "up")
	l.sh("ip", "-n", far, "route", "add", "default", "via", "198.51.100.1")
	heard := l.listen(far, "import socket\nls = []\nfor p in (80, 443):\n    s = socket.socket(); s.bind(('"+remote+"', p)); s.listen(4); ls.append(s)\nprint('listening', flush=True)\nimport select\nwhile True:\n    r, _, _ = select.select(ls, [], [])\n    for s in r:\n        c, a = s.accept(); print('reached', a[0], flush=True); c.close()\n")
	got := l.listen(l.host, captureListener, limGW, "3180", "3443")

	fw := New(nsRunner{l.host})
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest), CaptureHTTPPort: 3180, CaptureTLSPort: 3443}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Remove(ctx, limBridge) })
	if st, err := fw.Check(ctx, b); err != nil || !st.Intact() {
		t.Fatalf("Check = %+v, %v", st, err)
	}
	probe := func(host, port string) string {
		t.Helper()
		return strings.TrimSpace(l.in(l.guest, "python3", "-c", captureProbe, host, port))
	}
	for _, tc := range []struct{ host, port, want string }{
		{remote, "443", "captured " + remote + ":443 on 3443"},
		{remote, "80", "captured " + remote + ":80 on 3180"},
		{"203.0.113.9", "443", "captured 203.0.113.9:443 on 3443"},
		// The gateway itself is not captured: its 443 is no service.
		{limGW, "443", "refused"},
		// Other ports are not captured: answered as before.
		{remote, "8443", "refused"},
	} {
		if r := probe(tc.host, tc.port); r != tc.want {
			t.Errorf("capture on: guest to %s:%s: %q, want %q", tc.host, tc.port, r, tc.want)
		}
	}
	if !strings.Contains(got.String(), "on 3443 "+limGuest) {
		t.Errorf("capture listener heard %q, want the guest's connection from %s", got.String(), limGuest)
	}

	// The capture chain gone, the host forwarding and routing to the
	// remote address: nothing reaches it (the answer chain lets the flow
	// by, the FORWARD chain drops it), and nothing reaches the capture
	// ports either.
	l.sh("ip", "netns", "exec", l.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	if _, err := (nsRunner{l.host}).Run(ctx, "nft", "delete", "chain", "ip", AnswerTableName(limBridge), "capture"); err != nil {
		t.Fatal(err)
	}
	if st, err := fw.Check(ctx, b); err != nil || st.Intact() {
		t.Errorf("Check without the capture chain = %+v, %v; want it named", st, err)
	}
	before := got.String()
	for _, port := range []string{"443", "80"} {
		if r := probe(remote, port); r != "timeout" {
			t.Errorf("capture chain gone, forwarding on: guest to %s:%s: %q, want a timeout (dropped)", remote, port, r)
		}
	}
	if strings.Contains(heard.String(), "reached") {
		t.Errorf("without the capture chain the remote heard %q, want nothing", heard.String())
	}
	if got.String() != before {
		t.Errorf("without the capture chain the capture ports heard %q", strings.TrimPrefix(got.String(), before))
	}

	// Capture off (the table as before capture): refused at once again.
	off := b
	off.CaptureHTTPPort, off.CaptureTLSPort = 0, 0
	if err := fw.Ensure(ctx, off); err != nil {
		t.Fatal(err)
	}
	if r := probe(remote, "443"); r != "refused" {
		t.Errorf("capture off: guest to %s:443: %q, want refused", remote, r)
	}
}

// listen runs a python listener in namespace ns and waits until it says
// it is listening.
func (l *limitsLab) listen(ns, script string, args ...string) *syncbuf.Buffer {
	l.t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, "python3", "-u", "-c", script}, args...)...)
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 50 && !strings.Contains(out.String(), "listening"); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(out.String(), "listening") {
		l.t.Fatalf("listener in %s: %s", ns, out.String())
	}
	return out
}
