//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/testutil/syncbuf"
)

// filtersAlone takes every packet layer away from a running guest (the
// nwfilter opened to accept-all, abox's host chains and libvirt's own
// chains removed, the guard paused so it cannot put them back) and checks
// that the DNS filter and the proxy on their own still refuse what they
// must: names off the allowlist, URLs off it, and private or host
// addresses through the proxy. The control shows the packet layers really
// were gone (direct egress works meanwhile). Everything is put back.
func (s *suite) filtersAlone(t *testing.T, st instance.State, fw *hostfw.Firewall) {
	b := instance.FirewallBridge(st)
	sup := s.daemonPID(t, st.Name)
	syscall.Kill(sup, syscall.SIGSTOP)
	defer syscall.Kill(sup, syscall.SIGCONT)
	s.openNWFilter(t, st.Name)
	defer s.restoreNWFilter(t, st.Name)
	if err := fw.Remove(s.ctx, st.Bridge); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fw.Ensure(s.ctx, b); err != nil {
			t.Errorf("restoring the chains: %v", err)
		}
	}()
	for _, c := range []string{"LIBVIRT_FWI", "LIBVIRT_FWO", "LIBVIRT_FWX", "LIBVIRT_INP", "LIBVIRT_OUT"} {
		s.inNS(10*time.Second, "iptables", "-w", "10", "-F", c)
	}
	gw := st.Gateway.String()
	proxy := fmt.Sprintf("http://%s:%d", gw, st.ProxyPort)

	// Control: no packet layer is left, so a direct connection leaves.
	if out, err := s.guest(st.Name, "curl -sS -m 8 --noproxy '*' http://"+originIP+"/direct"); err != nil || !strings.Contains(out, "GET /direct") {
		t.Fatalf("control: with every packet layer removed direct egress still failed (%v: %q); the test proves nothing", err, out)
	}
	if out := s.mustGuest(t, st.Name, "dig +tries=2 +time=4 @"+gw+" blocked.test"); !strings.Contains(out, "status: NXDOMAIN") {
		t.Errorf("a name off the allowlist with only the filters: %s", out)
	}
	if out := s.mustGuest(t, st.Name, "dig +short +tries=2 +time=4 @"+gw+" allowed.test"); !hasLine(out, originIP) {
		t.Errorf("control: allowed.test with only the filters = %q, want %s", out, originIP)
	}
	out, _ := s.guest(st.Name, "curl -sS -m 15 -i -x "+proxy+" http://blocked.test/ || true")
	if !strings.Contains(out, " 403 ") || !strings.Contains(out, "not_allowlisted") {
		t.Errorf("a URL off the allowlist through the proxy with only the filters:\n%s", out)
	}
	code := "curl -sS -m 15 --noproxy '' -o /dev/null -w '%{http_code}' -x " + proxy + " "
	for _, u := range []string{"http://" + lab.HostSide + ":8081/", "http://" + gw + ":8081/", "http://127.0.0.1:8081/", "http://10.0.0.5/"} {
		if out, _ := s.guest(st.Name, code+"'"+u+"'"); out != "403" {
			t.Errorf("%s through the proxy with only the filters = %q, want 403", u, out)
		}
	}
	if out := s.mustGuest(t, st.Name, "curl -sS -m 15 -x "+proxy+" http://allowed.test/filters-alone"); !strings.Contains(out, "GET /filters-alone") {
		t.Errorf("control: an allowlisted URL through the proxy with only the filters = %q", out)
	}
}

// networkRestart destroys and starts the instance's libvirt network under
// the running guest (`virsh net-destroy` + `net-start`, what a libvirt
// upgrade or an administrator does). libvirt recreates the bridge but
// leaves the guest's tap detached from it: a detached tap is an ordinary
// host interface, past the nwfilter (bridged traffic only) and the host
// chains (matched on the bridge), so the guest's packets would reach the
// host's own IP stack. Meanwhile a hostile guest sends UDP to a host
// listener (it flushes its ARP cache each time, so it learns the tap's
// address); afterwards the listener must have heard nothing, the guard must
// have put the tap back on the bridge with every layer holding, and the
// guest must work through its filters again.
func (s *suite) networkRestart(t *testing.T, st instance.State, fw *hostfw.Firewall, nic string) {
	b := instance.FirewallBridge(st)
	gw := st.Gateway.String()
	ports, err := s.inNS(10*time.Second, "sh", "-c", "ip -o link show master "+st.Bridge+" | awk -F': ' '{print $2}'")
	tap := strings.Fields(ports)
	if err != nil || len(tap) != 1 {
		t.Fatalf("ports of %s = %q, want the guest's tap alone", st.Bridge, tap)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 3*time.Minute)
	defer cancel()
	const leakPort = "9999"
	listen := s.env.NetCommand(ctx, "python3", "-u", "-c", `import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", `+leakPort+`))
print("listening", flush=True)
while True:
    data, addr = s.recvfrom(2048)
    print(addr[0], data.decode(errors="replace").strip(), flush=True)
`)
	var heard syncbuf.Buffer
	listen.Stdout, listen.Stderr = &heard, &heard
	if err := listen.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { listen.Process.Kill(); listen.Wait() }()
	if err := poll(ctx, 10*time.Second, func() bool { return strings.Contains(heard.String(), "listening") }); err != nil {
		t.Fatalf("the host's UDP listener did not start: %s", heard.String())
	}
	// Control: the listener hears what reaches the host's stack.
	s.inNS(10*time.Second, "bash", "-c", "echo control > /dev/udp/127.0.0.1/"+leakPort)
	// The guest's prober: for 40 s from now, a round every 0.3 s; it
	// counts its rounds and says when it is done.
	prober := "i=0; end=$((SECONDS+40)); while [ $SECONDS -lt $end ]; do i=$((i+1)); ip neigh flush dev " + nic + "; for a in " + gw + " " + lab.HostSide + "; do echo leak-$i > /dev/udp/$a/" + leakPort + "; done; echo $i > /tmp/abox-prober; sleep 0.3; done; echo done $i > /tmp/abox-prober"
	s.mustGuest(t, st.Name, "sudo nohup bash -c '"+prober+"' >/dev/null 2>&1 &")
	time.Sleep(2 * time.Second)
	for _, args := range [][]string{{"net-destroy", "abox-" + st.Name}, {"net-start", "abox-" + st.Name}} {
		if out, err := s.env.Virsh(s.ctx, args...); err != nil {
			t.Fatalf("virsh %v: %v: %s", args, err, out)
		}
	}
	restarted := time.Now()
	back := s.waitSSH(st.Name, time.Minute)
	if back == nil {
		t.Logf("FIGURE guest back on its network %s after the restart", time.Since(restarted).Round(100*time.Millisecond))
		var last string
		if err := poll(s.ctx, 60*time.Second, func() bool {
			last, _ = s.guest(st.Name, "cat /tmp/abox-prober")
			return strings.HasPrefix(last, "done ")
		}); err != nil {
			t.Errorf("the guest's prober did not finish (last %q)", last)
		} else if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(last, "done "))); n < 10 {
			t.Errorf("the guest's prober ran %d rounds, want at least 10", n)
		} else {
			t.Logf("the guest's prober ran %d rounds", n)
		}
	} else {
		time.Sleep(40 * time.Second) // the prober's rounds
	}
	got := heard.String()
	if !strings.Contains(got, "control") {
		t.Fatalf("control: the host's UDP listener heard nothing, not even from the host; the test proves nothing:\n%s", got)
	}
	if strings.Contains(got, "leak-") {
		t.Errorf("during the network restart the guest's UDP reached a host service (port %s):\n%s", leakPort, tail(got, 6))
	}
	if back != nil {
		ports, _ := s.inNS(10*time.Second, "ip", "-o", "link", "show", "master", st.Bridge)
		t.Fatalf("the guest did not come back after the network restart: %v\nports of %s: %q", back, st.Bridge, ports)
	}
	// Every layer holds again: the chains and switches, the tap on the
	// bridge with its nwfilter bound, the filters refusing and serving.
	if status, err := fw.Check(s.ctx, b); err != nil || !status.Intact() {
		t.Errorf("host firewall after the restart: %v %q", err, status.Problems)
	}
	if ports, _ := s.inNS(10*time.Second, "ip", "-o", "link", "show", "master", st.Bridge); !strings.Contains(ports, tap[0]+":") {
		t.Errorf("tap %s is not a port of %s after the restart: %q", tap[0], st.Bridge, ports)
	}
	if out, err := s.env.Virsh(s.ctx, "nwfilter-binding-list"); err != nil || !strings.Contains(out, tap[0]) || !strings.Contains(out, "abox-"+st.Name) {
		t.Errorf("nwfilter binding of %s after the restart (%v):\n%s", tap[0], err, out)
	}
	if out, _ := s.guest(st.Name, "curl -sS -m 6 --noproxy '*' http://"+gw+":8081/"); strings.Contains(out, "HOST SERVICE") {
		t.Errorf("after the network restart the guest reached a host service: %q", out)
	}
	if out, err := s.guest(st.Name, "curl -sS -m 6 --noproxy '*' http://"+originIP+"/direct"); err == nil {
		t.Errorf("after the network restart direct egress worked: %q", out)
	}
	if out := s.mustGuest(t, st.Name, "dig +tries=2 +time=4 @"+gw+" blocked.test"); !strings.Contains(out, "status: NXDOMAIN") {
		t.Errorf("after the network restart a name off the allowlist: %s", out)
	}
	proxy := fmt.Sprintf("http://%s:%d", gw, st.ProxyPort)
	if out := s.mustGuest(t, st.Name, "curl -sS -m 15 -x "+proxy+" http://allowed.test/net-restart"); !strings.Contains(out, "GET /net-restart") {
		t.Errorf("after the network restart an allowlisted URL through the proxy = %q", out)
	}
	if out, _ := s.guest(st.Name, "curl -sS -m 15 -o /dev/null -w '%{http_code}' -x "+proxy+" http://"+lab.HostSide+":8081/"); out != "403" {
		t.Errorf("after the network restart a host address through the proxy = %q, want 403", out)
	}
}

// logNetState logs what a guest unreachable from the host needs looked
// at: its tap and link, the nwfilter binding, the chains, the daemon's log.
func (s *suite) logNetState(t *testing.T, st instance.State) {
	t.Helper()
	ports, _ := s.inNS(10*time.Second, "ip", "-o", "link", "show", "master", st.Bridge)
	neigh, _ := s.inNS(10*time.Second, "ip", "neigh", "show", "dev", st.Bridge)
	ifl, _ := s.env.Virsh(s.ctx, "domiflist", "abox-"+st.Name)
	bind, _ := s.env.Virsh(s.ctx, "nwfilter-binding-list")
	mangle, _ := s.inNS(10*time.Second, "iptables", "-w", "10", "-t", hostfw.Table, "-S")
	ebt, _ := s.inNS(10*time.Second, "ebtables", "-t", "nat", "-L")
	dlog, _ := os.ReadFile(paths.Layout{Root: s.home}.Instance(st.Name).DaemonLog)
	t.Logf("ports of %s: %s\nneighbours: %s\ndomiflist: %s\nbindings: %s\nmangle:\n%s\nebtables nat:\n%s\ndaemon.log:\n%s",
		st.Bridge, ports, neigh, ifl, bind, mangle, ebt, tail(string(dlog), 20))
}
