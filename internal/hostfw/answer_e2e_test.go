//go:build e2e

package hostfw

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// answerProbe is run in the guest namespace: it tries one flow and prints
// what became of it and how long that took, "refused 3ms",
// "unreachable 2ms" (an ICMP error), "timeout 2001ms" or "open 1ms".
const answerProbe = `import errno, socket, sys, time
proto, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind)
s.settimeout(2)
t = time.monotonic()
try:
    s.connect((host, port))
    if proto == "udp":
        s.send(b"probe")
        s.recv(512)
    r = "open"
except socket.timeout:
    r = "timeout"
except OSError as e:
    r = {errno.ECONNREFUSED: "refused", errno.EHOSTUNREACH: "unreachable"}.get(e.errno, errno.errorcode.get(e.errno, str(e)))
print(r, "%.1fms" % ((time.monotonic() - t) * 1000))
`

// TestE2ERefusedFlowsAnswered: with the chains but without the answer
// table, a guest's TCP and UDP to a remote address, to the host's other
// address and to a gateway port nothing is allowed on hang until the
// client's timeout; with it each is refused at once (TCP reset, ICMP
// administratively prohibited). The gateway's services still work, and a
// refused flow from a spoofed source gets no answer.
func TestE2ERefusedFlowsAnswered(t *testing.T) {
	l := newLimitsLab(t)
	need.Program(t, "nft")
	ctx := context.Background()
	l.sh("ip", "-n", l.guest, "route", "add", "default", "via", limGW)
	dns := l.udpListener(limGW, 53)
	r := nsRunner{l.host}
	fw := New(r)
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Remove(ctx, limBridge) })

	probe := func(proto, host string, port int) (string, string) {
		t.Helper()
		out := strings.Fields(l.in(l.guest, "python3", "-c", answerProbe, proto, host, strconv.Itoa(port)))
		if len(out) != 2 {
			t.Fatalf("probe printed %q", out)
		}
		return out[0], out[1]
	}
	refused := []struct {
		proto, host string
		port        int
		want        string
	}{
		{"tcp", "198.51.100.7", 443, "refused"},
		{"udp", "198.51.100.7", 53, "unreachable"},
		{"udp", "198.51.100.7", 443, "unreachable"},
		{"tcp", limOther, 8081, "refused"},
		{"tcp", limGW, 8081, "refused"},
		{"udp", limGW, 9999, "unreachable"},
	}
	check := func(stage string, answered bool) {
		t.Helper()
		for _, p := range refused {
			got, took := probe(p.proto, p.host, p.port)
			want := p.want
			if !answered {
				want = "timeout"
			}
			t.Logf("%s: guest %s to %s:%d: %s after %s", stage, p.proto, p.host, p.port, got, took)
			if got != want {
				t.Errorf("%s: guest %s to %s:%d: %s, want %s", stage, p.proto, p.host, p.port, got, want)
			}
		}
	}
	check("with the answer table", true)
	if got, took := probe("udp", limGW, 53); got != "timeout" || !strings.Contains(dns.String(), "probe") {
		// The listener does not answer: the datagram must arrive and
		// must not be refused.
		t.Errorf("guest UDP to the gateway's DNS: %s after %s, listener heard %q; want it delivered", got, took, dns.String())
	}
	if st, err := fw.Check(ctx, b); err != nil || !st.Intact() {
		t.Fatalf("Check = %+v, %v", st, err)
	}

	// A spoofed source is not answered (nor let through).
	l.sh("ip", "-n", l.guest, "addr", "add", "10.99.6.77/24", "dev", "vl0")
	out := strings.Fields(l.in(l.guest, "python3", "-c", strings.Replace(answerProbe, "s.settimeout(2)", "s.bind(('10.99.6.77', 0))\ns.settimeout(2)", 1), "tcp", "198.51.100.7", "443"))
	if len(out) != 2 || out[0] != "timeout" {
		t.Errorf("TCP from a spoofed source: %q, want a timeout (no answer)", out)
	}
	l.sh("ip", "-n", l.guest, "addr", "del", "10.99.6.77/24", "dev", "vl0")

	// Without the table the same flows hang: the answers come from it.
	if _, err := r.Run(ctx, "nft", "delete", "table", "ip", AnswerTableName(limBridge)); err != nil {
		t.Fatal(err)
	}
	if st, err := fw.Check(ctx, b); err != nil || st.Intact() {
		t.Errorf("Check without the table = %+v, %v; want it named", st, err)
	}
	check("without the answer table", false)
}

// TestE2EAnswersRateLimited: a guest flooding refused TCP gets at most
// the burst and the rate's worth of resets; the rest is dropped.
func TestE2EAnswersRateLimited(t *testing.T) {
	l := newLimitsLab(t)
	need.Program(t, "nft")
	ctx := context.Background()
	l.sh("ip", "-n", l.guest, "route", "add", "default", "via", limGW)
	fw := New(nsRunner{l.host})
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fw.Remove(ctx, limBridge) })
	// 400 non-blocking connects in one go, then count the refused ones.
	const flood = `import errno, select, socket, time
ss = []
t = time.monotonic()
for i in range(400):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex(("198.51.100.7", 443))
    ss.append(s)
time.sleep(0.5)
refused = sum(1 for s in ss if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED)
print(refused, "%d" % ((time.monotonic() - t) * 1000))
`
	out := strings.Fields(l.in(l.guest, "python3", "-c", flood))
	if len(out) != 2 {
		t.Fatalf("flood printed %q", out)
	}
	refused, _ := strconv.Atoi(out[0])
	ms, _ := strconv.Atoi(out[1])
	max := AnswerBurst + AnswerRate*(ms/1000+1)
	t.Logf("400 refused connects in %d ms: %d answered with a reset (limit: burst %d, %d/s: at most %d)", ms, refused, AnswerBurst, AnswerRate, max)
	if refused == 0 || refused > max {
		t.Errorf("%d of 400 connects answered in %d ms, want between 1 and %d", refused, ms, max)
	}
}
