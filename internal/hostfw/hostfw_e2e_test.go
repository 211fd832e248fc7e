//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// nsRunner runs every command inside a network namespace, so the test
// never touches the host's own firewall.
type nsRunner struct{ ns string }

func (r nsRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return r.RunInput(ctx, nil, name, args...)
}

func (r nsRunner) RunInput(ctx context.Context, input []byte, name string, args ...string) ([]byte, error) {
	return ExecRunner{}.RunInput(ctx, input, "ip", append([]string{"netns", "exec", r.ns, name}, args...)...)
}

// recorder remembers the commands it passes on.
type recorder struct {
	Runner
	cmds []string
}

func (r *recorder) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.cmds = append(r.cmds, name+" "+strings.Join(args, " "))
	return r.Runner.Run(ctx, name, args...)
}

func (r *recorder) RunInput(ctx context.Context, input []byte, name string, args ...string) ([]byte, error) {
	r.cmds = append(r.cmds, name+" "+strings.Join(args, " ")+" <<EOF\n"+string(input)+"EOF")
	return r.Runner.RunInput(ctx, input, name, args...)
}

// TestE2EInNamespace applies the chains with the real iptables and
// ip6tables in a namespace made for the test, checks them, tampers with
// them, repairs them and removes them.
func TestE2EInNamespace(t *testing.T) {
	need.Root(t, "network namespaces and iptables")
	for _, tool := range []string{"ip", "iptables", "ip6tables", "nft"} {
		need.Program(t, tool)
	}
	ctx := context.Background()
	ns := fmt.Sprintf("abx-fwtest-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", ns, err, out)
		}
	})
	r := nsRunner{ns}
	const bridge = "abx-fwtest0"
	b := Bridge{Name: bridge, Gateway: netip.MustParseAddr("10.99.0.1"), ProxyPort: 3128, Guest: netip.MustParseAddr("10.99.0.10")}
	// A real bridge, so the rules refer to an interface that exists.
	if _, err := r.Run(ctx, "ip", "link", "add", bridge, "type", "bridge"); err != nil {
		t.Fatal(err)
	}

	rec := &recorder{Runner: r}
	fw := New(rec)
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	// On an intact setup Ensure must only look: the wanted rules are
	// spelled exactly as the real iptables -S prints them.
	rec.cmds = nil
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	for _, c := range rec.cmds {
		if !strings.Contains(c, " -S ") && !strings.Contains(c, " -C ") && !strings.HasPrefix(c, "sysctl -n ") && !strings.HasPrefix(c, "nft list ") {
			t.Errorf("second Ensure changed something: %s", c)
		}
	}
	st, err := fw.Check(ctx, b)
	if err != nil || !st.Intact() {
		t.Fatalf("Check = %+v, %v", st, err)
	}
	dump := func(tool, chain string) string {
		t.Helper()
		out, err := r.Run(ctx, tool, "-t", "mangle", "-S", chain)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		want := "-P FORWARD ACCEPT\n-A FORWARD -o abx-fwtest0 -j ABOX-abx-fwtest0\n-A FORWARD -i abx-fwtest0 -j ABOX-abx-fwtest0"
		if got := dump(tool, "FORWARD"); got != want {
			t.Errorf("%s FORWARD:\n%s\nwant:\n%s", tool, got, want)
		}
		want = "-P OUTPUT ACCEPT\n-A OUTPUT -o abx-fwtest0 -j ABOXO-abx-fwtest0"
		if got := dump(tool, "OUTPUT"); got != want {
			t.Errorf("%s OUTPUT:\n%s\nwant:\n%s", tool, got, want)
		}
		if got := dump(tool, "ABOX-abx-fwtest0"); got != "-N ABOX-abx-fwtest0\n-A ABOX-abx-fwtest0 -j DROP" {
			t.Errorf("%s chain:\n%s", tool, got)
		}
		want = "-N ABOXO-abx-fwtest0\n-A ABOXO-abx-fwtest0 -j DROP"
		if tool == "iptables" {
			want = "-N ABOXO-abx-fwtest0\n" +
				"-A ABOXO-abx-fwtest0 -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n" +
				"-A ABOXO-abx-fwtest0 -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -j RETURN\n" +
				"-A ABOXO-abx-fwtest0 -j DROP"
		}
		if got := dump(tool, "ABOXO-abx-fwtest0"); got != want {
			t.Errorf("%s output chain:\n%s\nwant:\n%s", tool, got, want)
		}
		want = "-P INPUT ACCEPT\n-A INPUT -i abx-fwtest0 -j ABOXI-abx-fwtest0"
		if got := dump(tool, "INPUT"); got != want {
			t.Errorf("%s INPUT:\n%s\nwant:\n%s", tool, got, want)
		}
		want = "-N ABOXI-abx-fwtest0\n-A ABOXI-abx-fwtest0 -j DROP"
		if tool == "iptables" {
			want = "-N ABOXI-abx-fwtest0\n" +
				"-A ABOXI-abx-fwtest0 ! -s 10.99.0.10/32 -j DROP\n" +
				"-A ABOXI-abx-fwtest0 -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN\n" +
				"-A ABOXI-abx-fwtest0 -m conntrack --ctstate NEW -m connlimit --connlimit-above 4096 --connlimit-mask 0 --connlimit-saddr -j DROP\n" +
				"-A ABOXI-abx-fwtest0 -d 10.99.0.1/32 -p udp -m udp --dport 53 -j RETURN\n" +
				"-A ABOXI-abx-fwtest0 -d 10.99.0.1/32 -p tcp -m tcp --dport 3128 -m conntrack --ctstate NEW -j RETURN\n" +
				"-A ABOXI-abx-fwtest0 -d 10.99.0.1/32 -p icmp -m icmp --icmp-type 8 -j RETURN\n" +
				"-A ABOXI-abx-fwtest0 -d 10.99.0.1/32 -p tcp -m tcp --dport 53 -m conntrack --ctstate NEW -j RETURN\n" +
				"-A ABOXI-abx-fwtest0 -j DROP"
		}
		if got := dump(tool, "ABOXI-abx-fwtest0"); got != want {
			t.Errorf("%s input chain:\n%s\nwant:\n%s", tool, got, want)
		}
	}

	// Tamper: an ACCEPT in front of the DROP, an ACCEPT in front of the
	// output chain's rules, the SSH rule replaced; Check must notice and
	// Ensure must repair.
	for _, tamper := range [][]string{
		{"iptables", "-t", "mangle", "-I", "ABOX-abx-fwtest0", "1", "-j", "ACCEPT"},
		{"iptables", "-t", "mangle", "-I", "ABOXO-abx-fwtest0", "1", "-j", "ACCEPT"},
		{"iptables", "-t", "mangle", "-R", "ABOXO-abx-fwtest0", "2", "-p", "tcp", "--dport", "8080", "-j", "RETURN"},
		{"ip6tables", "-t", "mangle", "-I", "ABOXO-abx-fwtest0", "1", "-j", "ACCEPT"},
		{"iptables", "-t", "mangle", "-R", "ABOXI-abx-fwtest0", "3", "-p", "tcp", "--dport", "8081", "-j", "RETURN"},
		{"iptables", "-t", "mangle", "-R", "ABOXI-abx-fwtest0", "2", "-p", "udp", "--dport", "53", "-j", "RETURN"},
		{"iptables", "-t", "mangle", "-D", "INPUT", "-i", "abx-fwtest0", "-j", "ABOXI-abx-fwtest0"},
		{"ip6tables", "-t", "mangle", "-R", "ABOXI-abx-fwtest0", "1", "-j", "ACCEPT"},
	} {
		if _, err := r.Run(ctx, tamper[0], tamper[1:]...); err != nil {
			t.Fatal(err)
		}
		if st, _ := fw.Check(ctx, b); st.Intact() {
			t.Errorf("Check missed %v", tamper)
		}
		if err := fw.Ensure(ctx, b); err != nil {
			t.Fatal(err)
		}
		if st, err := fw.Check(ctx, b); err != nil || !st.Intact() {
			t.Errorf("after repairing %v: %+v, %v", tamper, st, err)
		}
	}

	for i := 0; i < 2; i++ {
		if err := fw.Remove(ctx, bridge); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, err := r.Run(ctx, tool, "-t", "mangle", "-S")
		if err != nil || strings.Contains(string(out), "ABOX") {
			t.Errorf("%s still has abox rules (%v):\n%s", tool, err, out)
		}
	}
}

// TestE2EForwardedTrafficDropped routes real TCP connections through a
// namespace acting as the host: a "guest" namespace behind the bridge and
// a "remote" namespace on another link. Connections across the host work
// before Ensure, fail in both directions after it, the host's proxy port on
// the gateway stays reachable from the guest (the FORWARD chain does not
// touch what is for the host itself, and the INPUT chain lets the proxy
// through), and everything works again after Remove.
func TestE2EForwardedTrafficDropped(t *testing.T) {
	need.Root(t, "network namespaces and iptables")
	for _, tool := range []string{"ip", "iptables", "ip6tables", "nft", "python3", "bash", "timeout"} {
		need.Program(t, tool)
	}
	ctx := context.Background()
	id := os.Getpid()
	host, guest, remote := fmt.Sprintf("abx-fwh-%d", id), fmt.Sprintf("abx-fwg-%d", id), fmt.Sprintf("abx-fwr-%d", id)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	for _, ns := range []string{host, guest, remote} {
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	const bridge = "abx-fwtest1"
	sh("ip", "-n", host, "link", "add", bridge, "type", "bridge")
	sh("ip", "-n", host, "addr", "add", "10.99.1.1/24", "dev", bridge)
	sh("ip", "-n", host, "link", "set", bridge, "up")
	sh("ip", "link", "add", "vg0", "netns", guest, "type", "veth", "peer", "name", "vg1", "netns", host)
	sh("ip", "-n", host, "link", "set", "vg1", "master", bridge, "up")
	sh("ip", "-n", guest, "addr", "add", "10.99.1.10/24", "dev", "vg0")
	sh("ip", "-n", guest, "link", "set", "vg0", "up")
	sh("ip", "-n", guest, "route", "add", "default", "via", "10.99.1.1")
	sh("ip", "link", "add", "vr0", "netns", remote, "type", "veth", "peer", "name", "vr1", "netns", host)
	sh("ip", "-n", host, "addr", "add", "10.99.2.1/24", "dev", "vr1")
	sh("ip", "-n", host, "link", "set", "vr1", "up")
	sh("ip", "-n", remote, "addr", "add", "10.99.2.10/24", "dev", "vr0")
	sh("ip", "-n", remote, "link", "set", "vr0", "up")
	sh("ip", "-n", remote, "route", "add", "default", "via", "10.99.2.1")
	sh("ip", "netns", "exec", host, "sysctl", "-qw", "net.ipv4.ip_forward=1")

	listen := func(ns, addr string) {
		cmd := exec.Command("ip", "netns", "exec", ns, "python3", "-m", "http.server", "--bind", addr, "8000")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	listen(remote, "10.99.2.10")
	listen(guest, "10.99.1.10")
	listen(host, "10.99.1.1")
	connects := func(from, addr string) bool {
		err := exec.Command("ip", "netns", "exec", from, "timeout", "2", "bash", "-c", "exec 3<>/dev/tcp/"+addr+"/8000").Run()
		return err == nil
	}
	// Wait for the listeners.
	for i := 0; i < 50 && !(connects(guest, "10.99.2.10") && connects(remote, "10.99.1.10") && connects(guest, "10.99.1.1")); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	check := func(stage string, wantForwarded bool) {
		t.Helper()
		if got := connects(guest, "10.99.2.10"); got != wantForwarded {
			t.Errorf("%s: guest -> remote connects = %v, want %v", stage, got, wantForwarded)
		}
		if got := connects(remote, "10.99.1.10"); got != wantForwarded {
			t.Errorf("%s: remote -> guest connects = %v, want %v", stage, got, wantForwarded)
		}
		if !connects(guest, "10.99.1.1") {
			t.Errorf("%s: guest cannot reach the host itself", stage)
		}
	}
	check("before Ensure", true)
	fw := New(nsRunner{host})
	if err := fw.Ensure(ctx, Bridge{Name: bridge, Gateway: netip.MustParseAddr("10.99.1.1"), ProxyPort: 8000, Guest: netip.MustParseAddr("10.99.1.10")}); err != nil {
		t.Fatal(err)
	}
	check("after Ensure", false)
	if err := fw.Remove(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	check("after Remove", true)
}

// TestE2EHostToGuest covers what the host itself sends into the bridge,
// which libvirt's nwfilter never sees: a "host" namespace holding the
// bridge and a "guest" namespace behind it. After Ensure the host can no
// longer open a connection to the guest's port 8080 (or anything over
// IPv6), can still open one to port 22, and still answers connections and
// datagrams the guest sends to its proxy port and port 53; after Remove
// port 8080 is reachable again, which shows the chain was what stopped it.
func TestE2EHostToGuest(t *testing.T) {
	need.Root(t, "network namespaces and iptables")
	for _, tool := range []string{"ip", "iptables", "ip6tables", "nft", "python3", "bash", "timeout", "head"} {
		need.Program(t, tool)
	}
	ctx := context.Background()
	id := os.Getpid()
	host, guest := fmt.Sprintf("abx-fwoh-%d", id), fmt.Sprintf("abx-fwog-%d", id)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	for _, ns := range []string{host, guest} {
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	const (
		bridge         = "abx-fwtest2"
		hostIP, hostV6 = "10.99.3.1", "fd00:99:3::1"
		guestIP        = "10.99.3.10"
		guestV6        = "fd00:99:3::10"
	)
	sh("ip", "-n", host, "link", "add", bridge, "type", "bridge")
	sh("ip", "-n", host, "addr", "add", hostIP+"/24", "dev", bridge)
	sh("ip", "-n", host, "addr", "add", hostV6+"/64", "dev", bridge, "nodad")
	sh("ip", "-n", host, "link", "set", bridge, "up")
	sh("ip", "link", "add", "vg0", "netns", guest, "type", "veth", "peer", "name", "vg1", "netns", host)
	sh("ip", "-n", host, "link", "set", "vg1", "master", bridge, "up")
	sh("ip", "-n", guest, "addr", "add", guestIP+"/24", "dev", "vg0")
	sh("ip", "-n", guest, "addr", "add", guestV6+"/64", "dev", "vg0", "nodad")
	sh("ip", "-n", guest, "link", "set", "vg0", "up")

	start := func(ns string, args ...string) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	// Bound to "::", http.server listens on IPv4 and IPv6 alike.
	start(guest, "python3", "-m", "http.server", "--bind", "::", "8080")
	start(guest, "python3", "-m", "http.server", "--bind", "::", "22")
	// The host's proxy port and a UDP echo service on port 53 standing in
	// for the DNS filter: what the guest may reach on the host.
	start(host, "python3", "-m", "http.server", "--bind", hostIP, "8000")
	start(host, "python3", "-c", "import socket\n"+
		"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"+
		"s.bind(('"+hostIP+"', 53))\n"+
		"while True:\n"+
		"    d, a = s.recvfrom(512)\n"+
		"    try:\n        s.sendto(d, a)\n"+
		"    except OSError:\n        pass  # EPERM while a reply is dropped\n")

	// fetch opens a new TCP connection from ns and returns the start of the
	// HTTP answer, so a success means packets went both ways.
	fetch := func(ns, addr, port string) string {
		script := "exec 3<>/dev/tcp/" + addr + "/" + port + " && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && head -c 12 <&3"
		out, _ := exec.Command("ip", "netns", "exec", ns, "timeout", "2", "bash", "-c", script).Output()
		return string(out)
	}
	works := func(ns, addr, port string) bool { return fetch(ns, addr, port) == "HTTP/1.0 200" }
	udpEcho := func() bool {
		out, _ := exec.Command("ip", "netns", "exec", guest, "python3", "-c", "import socket\n"+
			"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"+
			"s.settimeout(2)\n"+
			"s.sendto(b'query', ('"+hostIP+"', 53))\n"+
			"print(s.recv(512).decode())\n").Output()
		return strings.TrimSpace(string(out)) == "query"
	}
	ready := func() bool {
		return works(host, guestIP, "8080") && works(host, guestIP, "22") && works(guest, hostIP, "8000") && udpEcho()
	}
	for i := 0; i < 50 && !ready(); i++ {
		time.Sleep(100 * time.Millisecond)
	}

	check := func(stage string, wantNew bool) {
		t.Helper()
		if got := works(host, guestIP, "8080"); got != wantNew {
			t.Errorf("%s: host -> guest:8080 works = %v, want %v", stage, got, wantNew)
		}
		if got := works(host, guestV6, "22"); got != wantNew {
			t.Errorf("%s: host -> guest:22 over IPv6 works = %v, want %v", stage, got, wantNew)
		}
		if !works(host, guestIP, "22") {
			t.Errorf("%s: host -> guest:22 (SSH) does not work", stage)
		}
		if !works(guest, hostIP, "8000") {
			t.Errorf("%s: guest -> host:8000 gets no answer", stage)
		}
		if !udpEcho() {
			t.Errorf("%s: guest -> host UDP gets no answer", stage)
		}
	}
	check("before Ensure", true)
	fw := New(nsRunner{host})
	if err := fw.Ensure(ctx, Bridge{Name: bridge, Gateway: netip.MustParseAddr(hostIP), ProxyPort: 8000, Guest: netip.MustParseAddr(guestIP)}); err != nil {
		t.Fatal(err)
	}
	check("after Ensure", false)
	if out, err := (nsRunner{host}).Run(ctx, "iptables", "-t", "mangle", "-S"); err == nil {
		t.Logf("iptables -t mangle -S after Ensure:\n%s", out)
	}
	if err := fw.Remove(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	check("after Remove", true)
}

// TestE2EGuestToHost covers what the guest sends to the host itself, which
// only libvirt's nwfilter would otherwise restrict: a "host" namespace
// holding the bridge (gateway 10.99.4.1, plus 10.99.5.1 on its loopback
// standing for another host address) and a "guest" namespace behind it.
// The host listens everywhere on the proxy port, UDP and TCP 53, 8081 (an
// unrelated host service, like lab.HostListen in the VM suite) and 8081
// over IPv6. After Ensure the guest still gets DNS over UDP and TCP, the
// proxy and ping answers from the gateway, and SSH replies from itself to
// the host, but nothing else: not 8081, not the allowed ports on the other
// host address, nothing over IPv6. After Remove all of it works,
// which shows the chain was what stopped it.
func TestE2EGuestToHost(t *testing.T) {
	need.Root(t, "network namespaces and iptables")
	for _, tool := range []string{"ip", "iptables", "ip6tables", "nft", "python3", "bash", "timeout", "head"} {
		need.Program(t, tool)
	}
	ctx := context.Background()
	id := os.Getpid()
	host, guest := fmt.Sprintf("abx-fwih-%d", id), fmt.Sprintf("abx-fwig-%d", id)
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	for _, ns := range []string{host, guest} {
		sh("ip", "netns", "add", ns)
		t.Cleanup(func() {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		})
		sh("ip", "-n", ns, "link", "set", "lo", "up")
	}
	const (
		bridge       = "abx-fwtest3"
		gw, gwV6     = "10.99.4.1", "fd00:99:4::1"
		otherHostIP  = "10.99.5.1" // another address of the host
		guestIP      = "10.99.4.10"
		guestV6      = "fd00:99:4::10"
		proxyPort    = "3128"
		hostOnlyPort = "8081"
		guestSSHPort = "22"
		udpAnswer    = "query"
		// One socket per address, so that each answer comes from the
		// address the query went to (as a DNS server's does) and is a
		// conntrack reply the output chain lets through.
		pythonUDPEcho = "import select, socket, sys\nss = []\nfor a in sys.argv[1:]:\n" +
			"    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    s.bind((a, 53))\n    ss.append(s)\n" +
			"while True:\n    for s in select.select(ss, [], [])[0]:\n        d, a = s.recvfrom(512)\n" +
			"        try:\n            s.sendto(d, a)\n        except OSError:\n            pass\n"
		pythonPing = "import socket, struct, sys\n" +
			"def csum(b):\n    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))\n    s = (s >> 16) + (s & 0xffff)\n    s += s >> 16\n    return ~s & 0xffff\n" +
			"s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\ns.settimeout(2)\n" +
			"p = struct.pack('!BBHHH', 8, 0, 0, 0x4142, 1) + b'abox'\np = p[:2] + struct.pack('!H', csum(p)) + p[4:]\n" +
			"s.sendto(p, (sys.argv[1], 0))\n" +
			"while True:\n    d, a = s.recvfrom(1500)\n    h = (d[0] & 15) * 4\n" +
			"    if a[0] == sys.argv[1] and d[h] == 0 and d[h+4:h+6] == b'AB':\n        print('reply'); break\n"
	)
	sh("ip", "-n", host, "link", "add", bridge, "type", "bridge")
	sh("ip", "-n", host, "addr", "add", gw+"/24", "dev", bridge)
	sh("ip", "-n", host, "addr", "add", gwV6+"/64", "dev", bridge, "nodad")
	sh("ip", "-n", host, "addr", "add", otherHostIP+"/32", "dev", "lo")
	sh("ip", "-n", host, "link", "set", bridge, "up")
	sh("ip", "link", "add", "vg0", "netns", guest, "type", "veth", "peer", "name", "vg1", "netns", host)
	sh("ip", "-n", host, "link", "set", "vg1", "master", bridge, "up")
	sh("ip", "-n", guest, "addr", "add", guestIP+"/24", "dev", "vg0")
	sh("ip", "-n", guest, "addr", "add", guestV6+"/64", "dev", "vg0", "nodad")
	sh("ip", "-n", guest, "link", "set", "vg0", "up")
	sh("ip", "-n", guest, "route", "add", "default", "via", gw)

	start := func(ns string, args ...string) {
		cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
	// Bound to "::", http.server listens on every IPv4 and IPv6 address.
	for _, port := range []string{proxyPort, hostOnlyPort, "53"} {
		start(host, "python3", "-m", "http.server", "--bind", "::", port)
	}
	start(host, "python3", "-c", pythonUDPEcho, gw, otherHostIP)
	start(guest, "python3", "-m", "http.server", "--bind", guestIP, guestSSHPort)

	fetch := func(ns, addr, port string) bool {
		script := "exec 3<>/dev/tcp/" + addr + "/" + port + " && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && head -c 12 <&3"
		out, _ := exec.Command("ip", "netns", "exec", ns, "timeout", "2", "bash", "-c", script).Output()
		return string(out) == "HTTP/1.0 200"
	}
	udp := func(addr string) bool {
		out, _ := exec.Command("ip", "netns", "exec", guest, "python3", "-c", "import socket\n"+
			"s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"+
			"s.settimeout(2)\n"+
			"s.sendto(b'"+udpAnswer+"', ('"+addr+"', 53))\n"+
			"print(s.recv(512).decode())\n").Output()
		return strings.TrimSpace(string(out)) == udpAnswer
	}
	ping := func(addr string) bool {
		out, _ := exec.Command("ip", "netns", "exec", guest, "timeout", "3", "python3", "-c", pythonPing, addr).Output()
		return strings.TrimSpace(string(out)) == "reply"
	}
	type probe struct {
		what string
		ok   func() bool
	}
	// allowed must work whether or not the chain is there.
	allowed := []probe{
		{"guest -> gateway UDP/53", func() bool { return udp(gw) }},
		{"guest -> gateway TCP/53", func() bool { return fetch(guest, gw, "53") }},
		{"guest -> gateway proxy port", func() bool { return fetch(guest, gw, proxyPort) }},
		{"guest -> gateway ping", func() bool { return ping(gw) }},
		{"host -> guest:22 (replies come in through INPUT)", func() bool { return fetch(host, guestIP, guestSSHPort) }},
	}
	// blocked must fail with the chain and work without it.
	blocked := []probe{
		{"guest -> gateway:8081", func() bool { return fetch(guest, gw, hostOnlyPort) }},
		{"guest -> other host address TCP/53", func() bool { return fetch(guest, otherHostIP, "53") }},
		{"guest -> other host address:8081", func() bool { return fetch(guest, otherHostIP, hostOnlyPort) }},
		{"guest -> other host address proxy port", func() bool { return fetch(guest, otherHostIP, proxyPort) }},
		{"guest -> other host address UDP/53", func() bool { return udp(otherHostIP) }},
		{"guest -> other host address ping", func() bool { return ping(otherHostIP) }},
		{"guest -> gateway:8081 over IPv6", func() bool { return fetch(guest, gwV6, hostOnlyPort) }},
		{"guest -> gateway proxy port over IPv6", func() bool { return fetch(guest, gwV6, proxyPort) }},
	}
	ready := func() bool {
		for _, p := range append(slices.Clone(allowed), blocked...) {
			if !p.ok() {
				return false
			}
		}
		return true
	}
	for i := 0; i < 50 && !ready(); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	check := func(stage string, chain bool) {
		t.Helper()
		for _, p := range allowed {
			if !p.ok() {
				t.Errorf("%s: %s does not work", stage, p.what)
			}
		}
		for _, p := range blocked {
			if got := p.ok(); got == chain {
				t.Errorf("%s: %s works = %v, want %v", stage, p.what, got, !chain)
			}
		}
	}
	check("before Ensure", false)
	r := nsRunner{host}
	fw := New(r)
	b := Bridge{Name: bridge, Gateway: netip.MustParseAddr(gw), ProxyPort: 3128, Guest: netip.MustParseAddr(guestIP)}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	check("after Ensure", true)
	if out, err := r.Run(ctx, "iptables", "-t", "mangle", "-S"); err == nil {
		t.Logf("iptables -t mangle -S after Ensure:\n%s", out)
	}
	if err := fw.Remove(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	check("after Remove", false)
}
