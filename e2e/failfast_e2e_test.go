//go:build e2e

package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
)

// timed wraps a guest command so that it prints, after its own output, how
// it ended and how long it took by the guest's clock.
func timed(command string) string {
	return "t0=$(date +%s%N); " + command + " 2>&1; rc=$?; echo; echo \"ABOX-TIMED rc=$rc ms=$(( ($(date +%s%N) - t0) / 1000000 ))\""
}

var timedRE = regexp.MustCompile(`ABOX-TIMED rc=(\d+) ms=(\d+)`)

// quicProbe sends one QUIC-Initial-sized datagram from a connected UDP
// socket and waits 5 s for anything back: an ICMP error shows as the
// socket's error.
const quicProbe = `python3 -c 'import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
s.connect((sys.argv[1], 443))
s.send(b"\xc0" + bytes(1199))
try:
    s.recv(1500)
    print("answered")
except socket.timeout:
    print("timed out")
except OSError as e:
    print("error:", e.strerror)
' `

// refusedFlowsAnswered: every flow the layers refuse gets an answer from
// the host, so the client fails at once with an error of the right kind
// instead of waiting out its timeout. Under the lab's namespace nothing
// outside answers (1.1.1.1 is not routed, the origin and the host listen
// but are never reached), so a refusal can only come from abox. The
// elapsed time, by the guest's clock, is logged; the assertion is on the
// error kind (a timeout is the failure). A control with the answer table
// deleted shows the same flows hanging.
func (s *suite) refusedFlowsAnswered(t *testing.T, st instance.State) {
	gw := st.Gateway.String()
	tcp := func(url string) string { return "curl -sS -v -m 10 --noproxy '*' -o /dev/null " + url }
	refusedTCP := "Connection refused" // curl -v: "connect to ... port ... failed: Connection refused"
	capturedTLS := "access denied"     // curl -v: "tlsv1 alert access denied"
	// dig: ";; communications error to ADDR#53: host unreachable" for
	// ICMP administratively prohibited.
	refusedDNS := "communications error to"
	probes := []struct {
		what, cmd, want string
	}{
		// Port 443 (and 80) of any address is captured (capture_e2e_test.go):
		// TLS to an address carries no SNI, so the capture refuses it with
		// an alert, at once.
		{"TCP to a public address (1.1.1.1:443)", tcp("https://1.1.1.1/"), capturedTLS},
		{"TCP to the origin (" + originIP + ":443)", tcp("https://" + originIP + "/"), capturedTLS},
		{"TCP to a public address's other port (1.1.1.1:8443)", tcp("telnet://1.1.1.1:8443 </dev/null"), refusedTCP},
		{"TCP to the origin's port 22", tcp("telnet://" + originIP + ":22 </dev/null"), refusedTCP},
		{"TCP to the host's other address (" + hostSide + ":8081)", tcp("http://" + hostSide + ":8081/"), refusedTCP},
		{"TCP to a gateway port with a host service (8081)", tcp("http://" + gw + ":8081/"), refusedTCP},
		{"TCP to a gateway port nothing listens on (7)", tcp("http://" + gw + ":7/"), refusedTCP},
		{"TCP to the gateway's port 22", tcp("telnet://" + gw + ":22 </dev/null"), refusedTCP},
		{"UDP DNS to another resolver (1.1.1.1)", "dig +tries=1 +time=5 @1.1.1.1 allowed.test", refusedDNS},
		{"UDP DNS to the origin's resolver", "dig +tries=1 +time=5 @" + originIP + " allowed.test", refusedDNS},
		{"UDP DNS to the gateway's other port (5300)", "dig +tries=1 +time=5 -p 5300 @" + gw + " allowed.test", refusedDNS},
		{"QUIC (UDP 443) to 1.1.1.1", quicProbe + "1.1.1.1", "error: No route to host"},
		{"QUIC (UDP 443) to the origin", quicProbe + originIP, "error: No route to host"},
	}
	probe := func(cmd string) (out string, rc, ms int) {
		t.Helper()
		out, _ = s.guest("dev", timed(cmd))
		m := timedRE.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s: no timing line in %q", cmd, out)
		}
		rc, _ = strconv.Atoi(m[1])
		ms, _ = strconv.Atoi(m[2])
		return out, rc, ms
	}
	for _, p := range probes {
		out, rc, ms := probe(p.cmd)
		t.Logf("FIGURE refused-flow %s: exit %d after %d ms by the guest's clock", p.what, rc, ms)
		if !strings.Contains(out, p.want) || strings.Contains(out, "timed out") {
			t.Errorf("%s: want %q, not a timeout; got (exit %d after %d ms):\n%s", p.what, p.want, rc, ms, out)
		}
		if strings.Contains(out, "HOST SERVICE") || strings.Contains(out, "ANSWER SECTION") || strings.Contains(out, "answered") {
			t.Errorf("%s reached something:\n%s", p.what, out)
		}
	}
	// IPv6: the guest has no route, so nothing reaches the host to be
	// answered; logged, for the docs' claim that it fails at once.
	v6, rc, ms := probe("curl -sS -6 -m 5 --noproxy '*' -o /dev/null 'http://[2606:4700:4700::1111]/'")
	t.Logf("FIGURE refused-flow IPv6 TCP to a global address: exit %d after %d ms: %s", rc, ms, strings.TrimSpace(timedRE.ReplaceAllString(v6, "")))
	// The gateway's services are never answered with a refusal.
	if out := s.mustGuest(t, "dev", "dig +short +tries=1 +time=5 @"+gw+" allowed.test"); !hasLine(out, originIP) {
		t.Errorf("DNS to the gateway = %q, want %s", out, originIP)
	}

	// Control: without the answer table the same flows hang until the
	// client's timeout, so the answers above came from it. The origin,
	// not 1.1.1.1: the lab's namespace has no route there and forwards,
	// so the kernel itself answers a flow to 1.1.1.1 with "network
	// unreachable" (after the table, which refuses it first), as it would
	// not on a host with a default route. The supervisor's guard would
	// put the table back within 2 s: pause it.
	sup := s.daemonPID(t, st.Name)
	syscall.Kill(sup, syscall.SIGSTOP)
	fw := hostfw.New(nsRunner{s})
	r := nsRunner{s}
	if _, err := r.Run(s.ctx, "nft", "delete", "table", "ip", hostfw.AnswerTableName(st.Bridge)); err != nil {
		syscall.Kill(sup, syscall.SIGCONT)
		t.Fatal(err)
	}
	tcpOut, tcpRC, tcpMS := probe("curl -sS -m 3 --noproxy '*' -o /dev/null https://" + originIP + "/")
	dnsOut, dnsRC, dnsMS := probe("dig +tries=1 +time=3 @" + originIP + " allowed.test")
	ferr := fw.Ensure(s.ctx, instance.FirewallBridge(st))
	syscall.Kill(sup, syscall.SIGCONT)
	if ferr != nil {
		t.Fatal(ferr)
	}
	t.Logf("control without the answer table: TCP exit %d after %d ms, DNS exit %d after %d ms", tcpRC, tcpMS, dnsRC, dnsMS)
	if tcpRC != 28 {
		t.Errorf("control: without the answer table TCP to the origin did not time out (exit %d after %d ms): the test proves nothing\n%s", tcpRC, tcpMS, tcpOut)
	}
	if !strings.Contains(dnsOut, "timed out") {
		t.Errorf("control: without the answer table DNS to the origin did not time out (exit %d after %d ms): the test proves nothing\n%s", dnsRC, dnsMS, dnsOut)
	}
	if out, _, ms := probe(tcp("https://" + originIP + "/")); !strings.Contains(out, capturedTLS) {
		t.Errorf("after Ensure TLS to the origin's address is not refused again (after %d ms):\n%s", ms, out)
	}
}
