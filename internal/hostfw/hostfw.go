// Package hostfw owns abox's host firewall chains: a per-bridge FORWARD default-deny chain in iptables and ip6tables.
package hostfw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/abox-dev/abox/internal/validate"
)

// Runner runs a program and returns its standard output. A failure must
// wrap an error with an ExitCode() int method (as *exec.ExitError has) so
// that "rule absent" (exit status 1) can be told from real failures.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// ExecRunner runs programs on the host with os/exec.
type ExecRunner struct{}

// Run runs name with args; a failure wraps the *exec.ExitError and carries
// the program's standard error.
func (ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("running %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Table is where the chains live. Not "filter": libvirt's nwfilter driver
// puts its own jumps (libvirt-in, libvirt-out, libvirt-in-post) at the top
// of filter/FORWARD when it instantiates a guest's filter, and those ACCEPT
// whatever the guest's nwfilter lets through, so a chain of ours there is
// pushed below them and never sees, for example, a routed connection from
// the LAN to the guest's port 22. mangle/FORWARD is traversed before
// filter/FORWARD and libvirt leaves it alone, so our DROP always comes
// first and survives libvirt restarting networks or filters.
const Table = "mangle"

// ChainPrefix starts every chain abox owns; the rest is the bridge name.
// iptables allows 28 characters, a bridge at most 15, so names always fit.
const ChainPrefix = "ABOX-"

// ChainName is the FORWARD chain for a bridge.
func ChainName(bridge string) string { return ChainPrefix + bridge }

// Firewall manages the chains through a Runner. The zero value is not
// usable; use New.
type Firewall struct {
	run Runner
	// tools are the binaries to program, in order: IPv4 first, since
	// that is the family the guest actually has.
	tools []string
}

// New returns a Firewall that programs iptables and ip6tables through r.
func New(r Runner) *Firewall {
	return &Firewall{run: r, tools: []string{"iptables", "ip6tables"}}
}

func (f *Firewall) ipt(ctx context.Context, tool string, args ...string) error {
	_, err := f.output(ctx, tool, args...)
	return err
}

func (f *Firewall) output(ctx context.Context, tool string, args ...string) ([]byte, error) {
	// -w 10: wait up to 10 s for the xtables lock, which libvirtd also
	// takes while it rewrites its own rules, instead of failing at once.
	return f.run.Run(ctx, tool, append([]string{"-w", "10", "-t", Table}, args...)...)
}

// chainRules returns the rules of chain as -S prints them (without the
// -N line), or ok=false if the chain does not exist.
func (f *Firewall) chainRules(ctx context.Context, tool, chain string) (rules []string, ok bool, err error) {
	out, err := f.output(ctx, tool, "-S", chain)
	if absent(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "-N ") {
			rules = append(rules, l)
		}
	}
	return rules, true, nil
}

// wantRules is the whole content of a bridge chain.
func wantRules(bridge string) []string { return []string{"-A " + ChainName(bridge) + " -j DROP"} }

// absent reports whether err is iptables' exit status 1, which -C and -S
// use for "no such rule/chain"; any other failure (missing binary, no
// permission, lock timeout) is a real error.
func absent(err error) bool {
	var ec interface{ ExitCode() int }
	return errors.As(err, &ec) && ec.ExitCode() == 1
}

// exists runs a -C or -S probe: true if it succeeded, false if the rule or
// chain is absent, error otherwise.
func (f *Firewall) exists(ctx context.Context, tool string, args ...string) (bool, error) {
	err := f.ipt(ctx, tool, args...)
	switch {
	case err == nil:
		return true, nil
	case absent(err):
		return false, nil
	}
	return false, err
}

func jumpIn(bridge string) []string {
	return []string{"FORWARD", "-i", bridge, "-j", ChainName(bridge)}
}
func jumpOut(bridge string) []string {
	return []string{"FORWARD", "-o", bridge, "-j", ChainName(bridge)}
}
func dropRule(bridge string) []string {
	return []string{ChainName(bridge), "-j", "DROP"}
}

// Ensure makes the bridge's chain exist, end in DROP, and be jumped to
// from the top of FORWARD for traffic entering and leaving the bridge. It
// changes only what is missing, so it is safe to run on every start and
// after libvirt restarts a network. The chain is filled before the jumps
// are added, so there is never a jump into an empty (accepting) chain.
func (f *Firewall) Ensure(ctx context.Context, bridge string) error {
	if err := validate.Bridge(bridge); err != nil {
		return fmt.Errorf("ensuring host firewall: %w", err)
	}
	chain := ChainName(bridge)
	for _, tool := range f.tools {
		if err := f.ensureChain(ctx, tool, bridge); err != nil {
			return fmt.Errorf("ensuring %s chain %s: %w", tool, chain, err)
		}
		for _, j := range []struct {
			rule   []string
			reason string
		}{
			{jumpIn(bridge), "inbound jump"},
			{jumpOut(bridge), "outbound jump"},
		} {
			ok, err := f.exists(ctx, tool, append([]string{"-C"}, j.rule...)...)
			if err != nil {
				return fmt.Errorf("ensuring %s %s for %s: %w", tool, j.reason, bridge, err)
			}
			if ok {
				continue
			}
			// Inserted at the top: an accepting rule someone else puts in
			// mangle/FORWARD must not come first.
			if err := f.ipt(ctx, tool, append([]string{"-I"}, j.rule...)...); err != nil {
				return fmt.Errorf("ensuring %s %s for %s: %w", tool, j.reason, bridge, err)
			}
		}
	}
	return nil
}

// ensureChain makes the chain hold exactly one rule, DROP. A chain that
// was tampered with (say an ACCEPT added in front) is repaired by first
// putting DROP at the top and only then deleting the rest, so the chain
// never accepts anything in between.
func (f *Firewall) ensureChain(ctx context.Context, tool, bridge string) error {
	chain := ChainName(bridge)
	rules, ok, err := f.chainRules(ctx, tool, chain)
	if err != nil {
		return err
	}
	if !ok {
		if err := f.ipt(ctx, tool, "-N", chain); err != nil {
			return fmt.Errorf("creating: %w", err)
		}
	}
	want := wantRules(bridge)
	if slices.Equal(rules, want) {
		return nil
	}
	if len(rules) == 0 || rules[0] != want[0] {
		if err := f.ipt(ctx, tool, append([]string{"-I", chain, "1"}, dropRule(bridge)[1:]...)...); err != nil {
			return fmt.Errorf("adding drop rule: %w", err)
		}
		rules = append(want, rules...)
	}
	for range rules[1:] {
		if err := f.ipt(ctx, tool, "-D", chain, "2"); err != nil {
			return fmt.Errorf("deleting foreign rule: %w", err)
		}
	}
	return nil
}

// Remove deletes the bridge's jumps and chain; whatever is already gone
// is skipped, so it is safe to repeat and to run after a partial Ensure.
// Every step is attempted and all errors are reported.
func (f *Firewall) Remove(ctx context.Context, bridge string) error {
	if err := validate.Bridge(bridge); err != nil {
		return fmt.Errorf("removing host firewall: %w", err)
	}
	chain := ChainName(bridge)
	var errs []error
	for _, tool := range f.tools {
		// No chain means no jumps: iptables refuses to delete a chain that
		// is still jumped to. Probing a jump to a missing chain is an
		// error (exit status 2), not "absent", so look at the chain first.
		ok, err := f.exists(ctx, tool, "-S", chain)
		if err != nil {
			errs = append(errs, fmt.Errorf("removing %s chain %s: %w", tool, chain, err))
			continue
		}
		if !ok {
			continue
		}
		for _, j := range [][]string{jumpIn(bridge), jumpOut(bridge)} {
			// Loop: a crash between -C and -I elsewhere could have left a
			// duplicate jump, and -D removes one at a time.
			for i := 0; i < 16; i++ {
				ok, err := f.exists(ctx, tool, append([]string{"-C"}, j...)...)
				if err != nil {
					errs = append(errs, fmt.Errorf("removing %s jump to %s: %w", tool, chain, err))
					break
				}
				if !ok {
					break
				}
				if err := f.ipt(ctx, tool, append([]string{"-D"}, j...)...); err != nil {
					errs = append(errs, fmt.Errorf("removing %s jump to %s: %w", tool, chain, err))
					break
				}
			}
		}
		if err := f.ipt(ctx, tool, "-F", chain); err != nil {
			errs = append(errs, fmt.Errorf("removing %s chain %s: flushing: %w", tool, chain, err))
			continue
		}
		if err := f.ipt(ctx, tool, "-X", chain); err != nil {
			errs = append(errs, fmt.Errorf("removing %s chain %s: deleting: %w", tool, chain, err))
		}
	}
	return errors.Join(errs...)
}

// Status says which parts of a bridge's firewall are in place.
type Status struct {
	Bridge   string
	Problems []string // empty when intact; each names a missing part
}

// Intact reports whether every part is in place.
func (s Status) Intact() bool { return len(s.Problems) == 0 }

// Check inspects the bridge's firewall without changing it. Problems are
// reported in Status; the error is for failing to look at all.
func (f *Firewall) Check(ctx context.Context, bridge string) (Status, error) {
	st := Status{Bridge: bridge}
	if err := validate.Bridge(bridge); err != nil {
		return st, fmt.Errorf("checking host firewall: %w", err)
	}
	chain := ChainName(bridge)
	for _, tool := range f.tools {
		rules, ok, err := f.chainRules(ctx, tool, chain)
		if err != nil {
			return st, fmt.Errorf("checking %s chain %s: %w", tool, chain, err)
		}
		if !ok {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: chain %s missing", tool, chain))
			continue
		}
		if !slices.Equal(rules, wantRules(bridge)) {
			st.Problems = append(st.Problems, fmt.Sprintf("%s: chain %s holds %q, want only %q", tool, chain, rules, wantRules(bridge)))
		}
		for _, c := range []struct {
			rule []string
			what string
		}{
			{jumpIn(bridge), "FORWARD jump for traffic from " + bridge},
			{jumpOut(bridge), "FORWARD jump for traffic to " + bridge},
		} {
			ok, err := f.exists(ctx, tool, append([]string{"-C"}, c.rule...)...)
			if err != nil {
				return st, fmt.Errorf("checking %s %s: %w", tool, c.what, err)
			}
			if !ok {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: %s missing", tool, c.what))
			}
		}
	}
	return st, nil
}
