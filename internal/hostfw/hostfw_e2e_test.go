//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// nsRunner runs every command inside a network namespace, so the test
// never touches the host's own firewall.
type nsRunner struct{ ns string }

func (r nsRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return ExecRunner{}.Run(ctx, "ip", append([]string{"netns", "exec", r.ns, name}, args...)...)
}

// TestE2EInNamespace applies the chains with the real iptables and
// ip6tables in a namespace made for the test, checks them, tampers with
// them, repairs them and removes them.
func TestE2EInNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
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
	// A real bridge, so the rules refer to an interface that exists.
	if _, err := r.Run(ctx, "ip", "link", "add", bridge, "type", "bridge"); err != nil {
		t.Fatal(err)
	}

	fw := New(r)
	for i := 0; i < 2; i++ {
		if err := fw.Ensure(ctx, bridge); err != nil {
			t.Fatalf("Ensure #%d: %v", i+1, err)
		}
	}
	st, err := fw.Check(ctx, bridge)
	if err != nil || !st.Intact() {
		t.Fatalf("Check = %+v, %v", st, err)
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, err := r.Run(ctx, tool, "-t", "mangle", "-S", "FORWARD")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		want := []string{"-P FORWARD ACCEPT", "-A FORWARD -o abx-fwtest0 -j ABOX-abx-fwtest0", "-A FORWARD -i abx-fwtest0 -j ABOX-abx-fwtest0"}
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s FORWARD:\n%s\nwant:\n%s", tool, out, strings.Join(want, "\n"))
		}
		chain, err := r.Run(ctx, tool, "-t", "mangle", "-S", "ABOX-abx-fwtest0")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(chain)); got != "-N ABOX-abx-fwtest0\n-A ABOX-abx-fwtest0 -j DROP" {
			t.Errorf("%s chain:\n%s", tool, got)
		}
	}

	// Tamper: an ACCEPT in front of the DROP; Check must notice and
	// Ensure must repair.
	if _, err := r.Run(ctx, "iptables", "-t", "mangle", "-I", "ABOX-abx-fwtest0", "1", "-j", "ACCEPT"); err != nil {
		t.Fatal(err)
	}
	if st, _ := fw.Check(ctx, bridge); st.Intact() {
		t.Error("Check missed an ACCEPT in the chain")
	}
	if err := fw.Ensure(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	if st, err := fw.Check(ctx, bridge); err != nil || !st.Intact() {
		t.Errorf("after repair: %+v, %v", st, err)
	}

	for i := 0; i < 2; i++ {
		if err := fw.Remove(ctx, bridge); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		out, _ := r.Run(ctx, tool, "-t", "mangle", "-S")
		if strings.Contains(string(out), "ABOX") {
			t.Errorf("%s still has abox rules:\n%s", tool, out)
		}
	}
}

// TestE2EForwardedTrafficDropped routes real TCP connections through a
// namespace acting as the host: a "guest" namespace behind the bridge and
// a "remote" namespace on another link. Connections across the host work
// before Ensure, fail in both directions after it, the host itself stays
// reachable from the guest (the chain is FORWARD only), and everything
// works again after Remove.
func TestE2EForwardedTrafficDropped(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"ip", "iptables", "ip6tables", "python3", "bash", "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
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
	if err := fw.Ensure(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	check("after Ensure", false)
	if err := fw.Remove(ctx, bridge); err != nil {
		t.Fatal(err)
	}
	check("after Remove", true)
}
