//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
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
		out, err := r.Run(ctx, tool, "-S", "FORWARD")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		want := []string{"-P FORWARD ACCEPT", "-A FORWARD -o abx-fwtest0 -j ABOX-abx-fwtest0", "-A FORWARD -i abx-fwtest0 -j ABOX-abx-fwtest0"}
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s FORWARD:\n%s\nwant:\n%s", tool, out, strings.Join(want, "\n"))
		}
		chain, err := r.Run(ctx, tool, "-S", "ABOX-abx-fwtest0")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(chain)); got != "-N ABOX-abx-fwtest0\n-A ABOX-abx-fwtest0 -j DROP" {
			t.Errorf("%s chain:\n%s", tool, got)
		}
	}

	// Tamper: an ACCEPT in front of the DROP; Check must notice and
	// Ensure must repair.
	if _, err := r.Run(ctx, "iptables", "-I", "ABOX-abx-fwtest0", "1", "-j", "ACCEPT"); err != nil {
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
		out, _ := r.Run(ctx, tool, "-S")
		if strings.Contains(string(out), "ABOX") {
			t.Errorf("%s still has abox rules:\n%s", tool, out)
		}
	}
}
