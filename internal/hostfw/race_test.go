package hostfw

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// The tests of this file hold abox to changing shared chains by rule
// specification: another process may change a chain between abox's
// listing of it and abox's change.

// injector returns a fakeTables.after hook that, right after each of the
// first n listings of chain by tool, puts a foreign rule at the top of
// chain: what another process (another instance's start or remove, an
// administrator) may do between abox's listing and its change. put
// collects the rules it added.
func injector(f *fakeTables, tool, chain string, n int, put *[]string) func(string, []string) {
	return func(tl string, args []string) {
		if tl != tool || args[0] != "-S" || args[1] != chain || len(*put) >= n {
			return
		}
		k := len(*put)
		r := fmt.Sprintf("-A %s -i abx-other%d -j ABOX-abx-other%d", chain, k, k) // another instance's jump
		if k%2 == 1 {
			r = fmt.Sprintf("-A %s -s 192.0.2.%d/32 -j ACCEPT", chain, k) // an administrator's rule
		}
		f.chains[tool][chain] = slices.Insert(f.chains[tool][chain], 0, r)
		*put = append(*put, r)
	}
}

// once checks that chain holds each of rules exactly once.
func once(t *testing.T, f *fakeTables, tool, chain string, rules ...string) {
	t.Helper()
	got := f.chains[tool][chain]
	for _, r := range rules {
		if n := countOf(got, r); n != 1 {
			t.Errorf("%s %s holds %q %d times, want once: %q", tool, chain, r, n, got)
		}
	}
}

func countOf(rules []string, r string) int {
	n := 0
	for _, x := range rules {
		if x == r {
			n++
		}
	}
	return n
}

// TestMovingAJumpUpDeletesNoOtherRule: Ensure moves a jump that a rule
// above it pushed out of the top block. A rule another process puts at
// the top of the shared chain between Ensure's listing and its change
// must not make Ensure delete some other rule instead of its old copy
// (by rule number it deleted the administrator's ACCEPT and kept two
// copies of its own jump).
func TestMovingAJumpUpDeletesNoOtherRule(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	jump := "-A INPUT -i " + br + " -j " + inChain
	admin := "-A INPUT -i " + br + " -j ACCEPT"
	tables.chains["iptables"]["INPUT"] = []string{admin, jump, "-A INPUT -j OTHER_IN"}
	var put []string
	tables.after = injector(tables, "iptables", "INPUT", 2, &put)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	if len(put) == 0 {
		t.Fatal("no foreign rule was put in between: the test proves nothing")
	}
	once(t, tables, "iptables", "INPUT", append([]string{admin, jump, "-A INPUT -j OTHER_IN"}, put...)...)
	if got := tables.chains["iptables"]["INPUT"]; got[0] != jump {
		t.Errorf("INPUT = %q, want abox's jump on top", got)
	}
}

// linkRunner answers `ip -j link show` with the bridge and one tap, a
// port of it, and `ip link set` with nothing; everything else goes to the
// fake tables.
type linkRunner struct {
	*fakeTables
	tap, mac string
}

func (l linkRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name != "ip" {
		return l.fakeTables.Run(ctx, name, args...)
	}
	if slices.Equal(args, []string{"-j", "link", "show"}) {
		return fmt.Appendf(nil, `[{"ifname":%q,"address":"52:54:00:00:00:fe"},{"ifname":%q,"master":%q,"address":%q}]`, br, l.tap, br, l.mac), nil
	}
	return nil, nil
}

// TestTapDropsGoBySpecification: EnsurePort deletes the drops of the
// guest's earlier taps and Remove all of them; a rule another process puts
// at the top of INPUT between the listing and the delete must survive
// (by rule number the delete took the rule above the stale drop, here the
// next program's, and Remove took the foreign rule itself and then could
// not delete the chain).
func TestTapDropsGoBySpecification(t *testing.T) {
	ctx := context.Background()
	const guestMAC = "52:54:00:aa:bb:07"
	tapMAC, _ := TapMAC(guestMAC)
	tables := newFakeTables()
	fw := testFirewall(t, linkRunner{tables, "vnet1", tapMAC})
	p := Port{Bridge: br, GuestMAC: guestMAC}
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	if err := fw.EnsurePort(ctx, p); err != nil {
		t.Fatal(err)
	}
	drop := "-A INPUT -i vnet1 -j " + fwdChain
	stale := "-A INPUT -i vnet0 -j " + fwdChain
	jump := "-A INPUT -i " + br + " -j " + inChain
	if got, want := tables.chains["iptables"]["INPUT"], []string{drop, jump, "-A INPUT -j OTHER_IN"}; !slices.Equal(got, want) {
		t.Fatalf("INPUT after EnsurePort = %q, want %q", got, want)
	}
	tables.chains["iptables"]["INPUT"] = append(tables.chains["iptables"]["INPUT"], stale)
	var put []string
	tables.after = injector(tables, "iptables", "INPUT", 2, &put)
	if err := fw.EnsurePort(ctx, p); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	if len(put) < 2 {
		t.Fatalf("foreign rules put in: %q, want two: the test proves nothing", put)
	}
	once(t, tables, "iptables", "INPUT", append([]string{drop, jump, "-A INPUT -j OTHER_IN"}, put...)...)
	if n := countOf(tables.chains["iptables"]["INPUT"], stale); n != 0 {
		t.Errorf("INPUT still holds the stale drop: %q", tables.chains["iptables"]["INPUT"])
	}

	kept := slices.Clone(tables.chains["iptables"]["INPUT"])
	put = nil
	tables.after = injector(tables, "iptables", "INPUT", 1, &put)
	if err := fw.Remove(ctx, br); err != nil {
		t.Errorf("Remove: %v", err)
	}
	tables.after = nil
	want := append(put, slices.DeleteFunc(kept, func(r string) bool { return r == drop || r == jump })...)
	if got := tables.chains["iptables"]["INPUT"]; !slices.Equal(got, want) {
		t.Errorf("INPUT after Remove = %q, want %q", got, want)
	}
}

// TestChainRepairIgnoresLateRules: a rule put into a tampered chain
// between Ensure's listing and its repair (an administrator, another
// Ensure of the same bridge) is gone after the repair too: the chain is
// written whole, not by rule numbers read before.
func TestChainRepairIgnoresLateRules(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.chains["iptables"][inChain] = slices.Insert(tables.chains["iptables"][inChain], 0, "-A "+inChain+" -j ACCEPT")
	var put []string
	tables.after = injector(tables, "iptables", inChain, 1, &put)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	if len(put) == 0 {
		t.Fatal("no rule was put in between: the test proves nothing")
	}
	if got := tables.chains["iptables"][inChain]; !slices.Equal(got, wantIn["iptables"]) {
		t.Errorf("%s after one repair = %q, want %q", inChain, got, wantIn["iptables"])
	}
}

// TestMovingAJumpUpLooksAgain: a copy of the jump that goes between the
// listing and the transaction (another abox process repairing the same
// jump) fails the transaction as a whole, and Ensure looks again; a
// transaction that keeps failing is Ensure's error.
func TestMovingAJumpUpLooksAgain(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	jump := "-A INPUT -i " + br + " -j " + inChain
	admin := "-A INPUT -i " + br + " -j ACCEPT"
	tables.chains["iptables"]["INPUT"] = []string{admin, jump, jump, "-A INPUT -j OTHER_IN"}
	gone := false
	tables.after = func(tool string, args []string) {
		if tool == "iptables" && args[0] == "-S" && args[1] == "INPUT" && !gone {
			gone = true
			tables.chains["iptables"]["INPUT"] = slices.Delete(tables.chains["iptables"]["INPUT"], 2, 3)
		}
	}
	tables.log = nil
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	if got, want := tables.chains["iptables"]["INPUT"], []string{jump, admin, "-A INPUT -j OTHER_IN"}; !slices.Equal(got, want) {
		t.Errorf("INPUT = %q, want %q", got, want)
	}
	n := 0
	for _, c := range tables.log {
		if strings.HasPrefix(c, "iptables-restore ") && strings.Contains(c, "-I INPUT 1 ") {
			n++
		}
	}
	if n != 2 {
		t.Errorf("%d transactions for the INPUT jump, want 2 (the first failing as a whole)", n)
	}

	tables.chains["iptables"]["INPUT"] = []string{admin, jump}
	tables.fail = "iptables-restore"
	if err := fw.Ensure(ctx, bb); err == nil || !strings.Contains(err.Error(), "INPUT jump") {
		t.Errorf("Ensure with iptables-restore failing = %v, want the INPUT jump's error", err)
	}
}
