package netclass

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestInstanceNetworksAreBridgesOnly: in a network namespace of its own, a
// real bridge named like an abox bridge marks its network as an instance
// network; a veth with the same prefix does not. Needs root (unshare, ip).
func TestInstanceNetworksAreBridgesOnly(t *testing.T) {
	if os.Getenv("ABOX_NETCLASS_IN_NETNS") == "1" {
		bridgeHelper(t)
		return
	}
	// CI runs as root with these tools: there a skip would hide a break.
	skip := t.Skipf
	if os.Getenv("CI") == "true" {
		skip = t.Fatalf
	}
	if os.Geteuid() != 0 {
		skip("needs root for a network namespace")
	}
	for _, tool := range []string{"unshare", "ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("needs %s", tool)
		}
	}
	cmd := exec.Command("unshare", "-nm", os.Args[0], "-test.run=^TestInstanceNetworksAreBridgesOnly$", "-test.v")
	cmd.Env = append(os.Environ(), "ABOX_NETCLASS_IN_NETNS=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "BRIDGES-ONLY OK") {
		t.Fatalf("in a network namespace: %v\n%s", err, out)
	}
}

func bridgeHelper(t *testing.T) {
	run := func(args ...string) {
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
	// This namespace's links, not the host's, under /sys/class/net.
	run("mount", "-t", "sysfs", "sysfs", "/sys")
	run("ip", "link", "add", "abx-br", "type", "bridge")
	run("ip", "addr", "add", "10.77.0.1/24", "dev", "abx-br")
	run("ip", "link", "add", "abx-veth", "type", "veth", "peer", "name", "other")
	run("ip", "addr", "add", "10.78.0.1/24", "dev", "abx-veth")
	s := readHost()
	if s == nil {
		t.Fatal("reading the namespace's interfaces failed")
	}
	has := func(p string) bool {
		for _, n := range s.instances {
			if n == netip.MustParsePrefix(p) {
				return true
			}
		}
		return false
	}
	if !has("10.77.0.0/24") || has("10.78.0.0/24") {
		t.Fatalf("instance networks %v, want the bridge's 10.77.0.0/24 only", s.instances)
	}
	p := NewPolicy([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, []netip.Addr{netip.MustParseAddr("10.77.0.1")})
	if c := p.Check(netip.MustParseAddr("10.77.0.2")); c != Instance {
		t.Fatalf("a guest on the bridge = %s, want %s", c, Instance)
	}
	if c := p.Check(netip.MustParseAddr("10.78.0.2")); c != Permitted {
		t.Fatalf("a neighbour on the veth = %s, want %s", c, Permitted)
	}
	t.Log("BRIDGES-ONLY OK")
}
