//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
	"github.com/abox-dev/abox/internal/testutil/syncbuf"
)

// limitsLab is a host namespace with a bridge (the gateway on it, another
// host address on lo) and a guest namespace plugged into the bridge.
type limitsLab struct {
	t           *testing.T
	host, guest string
}

const (
	limBridge = "abx-fwtest4"
	limGW     = "10.99.6.1"
	limOther  = "10.99.7.1"
	limGuest  = "10.99.6.10"
)

func newLimitsLab(t *testing.T) *limitsLab {
	t.Helper()
	need.Root(t, "network namespaces and iptables")
	for _, tool := range []string{"ip", "iptables", "ip6tables", "nft", "python3", "sysctl"} {
		need.Program(t, tool)
	}
	id := os.Getpid()
	l := &limitsLab{t: t, host: fmt.Sprintf("abx-fwlh-%d", id), guest: fmt.Sprintf("abx-fwlg-%d", id)}
	for _, ns := range []string{l.host, l.guest} {
		l.sh("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		l.sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	l.sh("ip", "-n", l.host, "link", "add", limBridge, "type", "bridge")
	l.sh("ip", "-n", l.host, "addr", "add", limGW+"/24", "dev", limBridge)
	l.sh("ip", "-n", l.host, "addr", "add", limOther+"/32", "dev", "lo")
	l.sh("ip", "-n", l.host, "link", "set", limBridge, "up")
	l.sh("ip", "link", "add", "vl0", "netns", l.guest, "type", "veth", "peer", "name", "vl1", "netns", l.host)
	l.sh("ip", "-n", l.host, "link", "set", "vl1", "master", limBridge, "up")
	l.sh("ip", "-n", l.guest, "addr", "add", limGuest+"/24", "dev", "vl0")
	l.sh("ip", "-n", l.guest, "link", "set", "vl0", "up")
	return l
}

func (l *limitsLab) sh(args ...string) string {
	l.t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		l.t.Fatalf("%v: %v: %s", args, err, out)
	}
	return string(out)
}

// udpListener runs a UDP listener on addr:port in the host namespace that
// prints each datagram's source and payload ("SRC PAYLOAD"), and waits
// until it is bound.
func (l *limitsLab) udpListener(addr string, port int) *syncbuf.Buffer {
	l.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", l.host, "python3", "-u", "-c",
		"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('"+addr+"', "+strconv.Itoa(port)+"))\nprint('listening')\n"+
			"while True:\n    d, a = s.recvfrom(512)\n    print(a[0], d.decode())\n")
	out := &syncbuf.Buffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; i < 50 && !strings.Contains(out.String(), "listening"); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	return out
}

func (l *limitsLab) in(ns string, args ...string) string {
	l.t.Helper()
	return l.sh(append([]string{"ip", "netns", "exec", ns}, args...)...)
}

// TestE2EARPOnlyForTheGateway: a guest ARPing for another of the host's
// addresses (here one on lo, reached by an on-link route) gets an answer
// from Linux's defaults, and none once Ensure has set the bridge's ARP
// switches; the gateway still answers.
func TestE2EARPOnlyForTheGateway(t *testing.T) {
	l := newLimitsLab(t)
	// On-link: the guest ARPs for the address itself instead of the gateway.
	l.in(l.guest, "ip", "route", "add", limOther+"/32", "dev", "vl0")
	resolves := func(addr string) bool {
		l.in(l.guest, "ip", "neigh", "flush", "dev", "vl0")
		// Any datagram to the address makes the guest ARP for it.
		l.in(l.guest, "python3", "-c", "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'x', ('"+addr+"', 9))\n")
		for i := 0; i < 20; i++ {
			out := l.in(l.guest, "ip", "neigh", "show", addr, "dev", "vl0")
			if strings.Contains(out, "lladdr") {
				return true
			}
			if strings.Contains(out, "FAILED") {
				return false
			}
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	if !resolves(limOther) {
		t.Fatalf("control: with Linux's default ARP switches the host did not answer for %s; the test proves nothing", limOther)
	}
	fw := New(nsRunner{l.host})
	if err := fw.Ensure(context.Background(), Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}); err != nil {
		t.Fatal(err)
	}
	if resolves(limOther) {
		t.Errorf("after Ensure the host still answers the guest's ARP for its other address %s", limOther)
	}
	if !resolves(limGW) {
		t.Errorf("after Ensure the gateway %s no longer answers ARP", limGW)
	}
}

// TestE2EConntrackLimit: a guest opening thousands of UDP "connections"
// (one source port each) to the gateway's DNS port fills the host's
// conntrack table without the chains; with them its entries stay at the
// bridge's ConnLimit.
func TestE2EConntrackLimit(t *testing.T) {
	l := newLimitsLab(t)
	const limit, sent = 300, 1500
	// A UDP echo on the gateway, so that entries are replied ones too.
	echo := exec.Command("ip", "netns", "exec", l.host, "python3", "-c",
		"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('"+limGW+"', 53))\n"+
			"while True:\n    d, a = s.recvfrom(512)\n    s.sendto(d, a)\n")
	if err := echo.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Process.Kill(); echo.Wait() })
	flood := func() {
		l.in(l.guest, "python3", "-c", "import socket\nfor i in range("+strconv.Itoa(sent)+"):\n"+
			"    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.sendto(b'q', ('"+limGW+"', 53))\n    s.close()\n")
		time.Sleep(300 * time.Millisecond)
	}
	count := func() int {
		n, err := strconv.Atoi(strings.TrimSpace(l.in(l.host, "cat", "/proc/sys/net/netfilter/nf_conntrack_count")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	fw := New(nsRunner{l.host})
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest), ConnLimit: limit}
	if err := fw.Ensure(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	flood()
	if n := count(); n > limit+20 {
		t.Errorf("with the chains: %d conntrack entries after %d new flows, want at most about %d", n, sent, limit)
	} else {
		t.Logf("with the chains: %d conntrack entries after %d new flows (limit %d)", n, sent, limit)
	}
	// Control: conntrack stays active (a rule that uses it) but the
	// chains are gone; the same flood must now fill the table.
	l.in(l.host, "iptables", "-t", "filter", "-A", "INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	if err := fw.Remove(context.Background(), limBridge); err != nil {
		t.Fatal(err)
	}
	flood()
	if n := count(); n < sent {
		t.Errorf("control: without the chains only %d entries after %d more flows; the test proves nothing", n, sent)
	}
}

// TestE2EOtherBridgesKeepWorking: br_netfilter sends every bridge's frames
// through iptables; with it on and abox's chains in place, a bridge that
// is not abox's (Docker's docker0, libvirt's default network) still
// carries traffic between its ports and to the host.
func TestE2EOtherBridgesKeepWorking(t *testing.T) {
	l := newLimitsLab(t)
	fw := New(nsRunner{l.host})
	if err := fw.Ensure(context.Background(), Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}); err != nil {
		t.Fatal(err)
	}
	id := os.Getpid()
	const other = "abx-dock0"
	l.sh("ip", "-n", l.host, "link", "add", other, "type", "bridge")
	l.sh("ip", "-n", l.host, "addr", "add", "172.31.9.1/24", "dev", other)
	l.sh("ip", "-n", l.host, "link", "set", other, "up")
	var ctrs []string
	for i, addr := range []string{"172.31.9.2", "172.31.9.3"} {
		ns := fmt.Sprintf("abx-fwc%d-%d", i, id)
		l.sh("ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		l.sh("ip", "-n", ns, "link", "set", "lo", "up")
		l.sh("ip", "link", "add", fmt.Sprintf("vc%d", i), "netns", ns, "type", "veth", "peer", "name", fmt.Sprintf("vh%d", i), "netns", l.host)
		l.sh("ip", "-n", l.host, "link", "set", fmt.Sprintf("vh%d", i), "master", other, "up")
		l.sh("ip", "-n", ns, "addr", "add", addr+"/24", "dev", fmt.Sprintf("vc%d", i))
		l.sh("ip", "-n", ns, "link", "set", fmt.Sprintf("vc%d", i), "up")
		ctrs = append(ctrs, ns)
	}
	if v := strings.TrimSpace(l.in(l.host, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables")); v != "1" {
		t.Fatalf("bridge netfilter is not on (%q): the test proves nothing", v)
	}
	srv := exec.Command("ip", "netns", "exec", ctrs[1], "python3", "-m", "http.server", "--bind", "172.31.9.3", "8000")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	hostSrv := exec.Command("ip", "netns", "exec", l.host, "python3", "-m", "http.server", "--bind", "172.31.9.1", "8001")
	if err := hostSrv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hostSrv.Process.Kill(); hostSrv.Wait() })
	get := func(ns, url string) bool {
		for i := 0; i < 30; i++ {
			out, _ := exec.Command("ip", "netns", "exec", ns, "python3", "-c",
				"import urllib.request\nprint(urllib.request.urlopen('"+url+"', timeout=2).status)").Output()
			if strings.TrimSpace(string(out)) == "200" {
				return true
			}
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}
	if !get(ctrs[0], "http://172.31.9.3:8000/") {
		t.Errorf("port to port on another bridge fails with br_netfilter and abox's chains")
	}
	if !get(ctrs[0], "http://172.31.9.1:8001/") {
		t.Errorf("port to host on another bridge fails with br_netfilter and abox's chains")
	}
}
