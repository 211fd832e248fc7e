//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// hookRunner calls after once a command it passes on succeeded.
type hookRunner struct {
	Runner
	after func(name string, args []string)
}

func (h *hookRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := h.Runner.Run(ctx, name, args...)
	if err == nil && h.after != nil {
		h.after(name, args)
	}
	return out, err
}

// TestE2ENoDeleteByRuleNumber runs Ensure, EnsurePort and Remove with the
// real iptables while, right after each of their listings of INPUT,
// another "process" (the test) puts a rule at the top of INPUT: another
// instance's jump, an administrator's ACCEPT. What abox deletes is its
// own: the foreign rules all survive, abox's old copies go. By rule
// number, the move of a pushed-down jump deleted the administrator's
// ACCEPT, the removal of a stale tap drop the rule above it, and Remove
// the foreign rule instead of the tap's drop (and then failed on the
// chain still jumped to).
func TestE2ENoDeleteByRuleNumber(t *testing.T) {
	l := newLimitsLab(t)
	ctx := context.Background()
	const guestMAC = "52:54:00:aa:bb:03"
	tapMAC, _ := TapMAC(guestMAC)
	l.in(l.host, "ip", "link", "set", "dev", "vl1", "address", tapMAC)
	l.in(l.host, "ip", "link", "set", "dev", limBridge, "address", "52:54:00:aa:bb:fe")
	h := &hookRunner{Runner: nsRunner{l.host}}
	fw := New(h)
	b := Bridge{Name: limBridge, Gateway: netip.MustParseAddr(limGW), ProxyPort: 3128, Guest: netip.MustParseAddr(limGuest)}
	p := Port{Bridge: limBridge, GuestMAC: guestMAC}
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := fw.EnsurePort(ctx, p); err != nil {
		t.Fatal(err)
	}
	input := func() []string {
		t.Helper()
		return strings.Split(strings.TrimSpace(l.in(l.host, "iptables", "-t", Table, "-S", "INPUT")), "\n")[1:]
	}
	var put []string
	// inject puts a foreign rule on top of INPUT after each of the next n
	// listings of INPUT.
	inject := func(n int) {
		left := n
		h.after = func(name string, args []string) {
			if name != "iptables" || !slices.Equal(args, []string{"-w", "10", "-t", Table, "-S", "INPUT"}) || left == 0 {
				return
			}
			left--
			k := len(put)
			rule := []string{"-i", fmt.Sprintf("abx-other%d", k), "-j", "ACCEPT"}
			if k%2 == 1 {
				rule = []string{"-s", fmt.Sprintf("192.0.2.%d/32", k), "-j", "ACCEPT"}
			}
			l.in(l.host, append([]string{"iptables", "-t", Table, "-I", "INPUT", "1"}, rule...)...)
			put = append(put, "-A INPUT "+strings.Join(rule, " "))
		}
	}
	once := func(stage string, rules ...string) {
		t.Helper()
		got := input()
		for _, r := range rules {
			n := 0
			for _, g := range got {
				if g == r {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s: INPUT holds %q %d times, want once:\n%s", stage, r, n, strings.Join(got, "\n"))
			}
		}
	}
	jump := "-A INPUT -i " + limBridge + " -j " + InputChainName(limBridge)
	drop := "-A INPUT -i vl1 -j " + ChainName(limBridge)

	// A pushed-down jump moved back up.
	admin := "-A INPUT -i " + limBridge + " -j ACCEPT"
	l.in(l.host, "iptables", "-t", Table, "-I", "INPUT", "1", "-i", limBridge, "-j", "ACCEPT")
	inject(2)
	if err := fw.Ensure(ctx, b); err != nil {
		t.Fatal(err)
	}
	h.after = nil
	if len(put) == 0 {
		t.Fatal("no foreign rule put in: the test proves nothing")
	}
	once("Ensure", append([]string{admin, jump, drop}, put...)...)
	if got := input(); got[0] != jump {
		t.Errorf("Ensure: INPUT does not start with abox's jump:\n%s", strings.Join(got, "\n"))
	}

	// A stale tap drop at the bottom deleted.
	stale := "-A INPUT -i vnet-old -j " + ChainName(limBridge)
	l.in(l.host, "iptables", "-t", Table, "-A", "INPUT", "-i", "vnet-old", "-j", ChainName(limBridge))
	n := len(put)
	inject(2)
	if err := fw.EnsurePort(ctx, p); err != nil {
		t.Fatal(err)
	}
	h.after = nil
	if len(put) < n+2 {
		t.Fatalf("foreign rules put in during EnsurePort: %q, want two: the test proves nothing", put[n:])
	}
	once("EnsurePort", append([]string{admin, jump, drop}, put...)...)
	if slices.Contains(input(), stale) {
		t.Errorf("EnsurePort left the stale drop:\n%s", strings.Join(input(), "\n"))
	}

	// Remove.
	n = len(put)
	inject(1)
	if err := fw.Remove(ctx, limBridge); err != nil {
		t.Errorf("Remove: %v", err)
	}
	h.after = nil
	if len(put) < n+1 {
		t.Fatal("no foreign rule put in during Remove: the test proves nothing")
	}
	once("Remove", append([]string{admin}, put...)...)
	if out := l.in(l.host, "iptables", "-t", Table, "-S"); strings.Contains(out, "ABOX") {
		t.Errorf("Remove left abox's rules:\n%s", out)
	}
}
