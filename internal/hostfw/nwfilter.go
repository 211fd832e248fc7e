package hostfw

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// libvirt's nwfilter driver (its ebiptables technology, libvirt 9.0)
// turns a binding of the instance's filter to a tap into kernel rules of
// its own, which abox's chains neither hold nor restore:
//
//   - ebtables, nat table: PREROUTING "-i TAP -j libvirt-I-TAP" (what the
//     guest sends) and POSTROUTING "-o TAP -j libvirt-O-TAP" (what it
//     receives), into chains holding the layer-2 rules (one MAC, one IP,
//     ARP, no IPv6), ending in DROP;
//   - iptables and ip6tables, filter table: FORWARD jumps to libvirt-in and
//     libvirt-out, INPUT to libvirt-host-in, which hold
//     "-m physdev --physdev-in TAP -g FI-TAP", "... --physdev-out TAP ...
//     -g FO-TAP" and "... --physdev-in TAP -g HI-TAP", into chains holding
//     the stateful layer-3 rules, ending in DROP.
//
// A flush of those tables (iptables -F, ebtables -t nat -F, a firewall
// reload) empties them while libvirt's binding stays: libvirt notices
// nothing and rebuilds them only when it reloads (SIGHUP, a restart) or
// the binding is created again. CheckNWFilter reports it.

// NWFilterFix is what restores the kernel rules of tap's binding when
// they are gone (seen with libvirt 9.0: each of these rebuilt them).
func NWFilterFix(tap string) string {
	return "have libvirt rebuild them: `virsh nwfilter-binding-dumpxml " + tap + " > b.xml && virsh nwfilter-binding-delete " + tap +
		" && virsh nwfilter-binding-create b.xml`, or reload libvirtd (`systemctl reload libvirtd`, virtnwfilterd with modular daemons; it rebuilds every binding); then find what flushed them"
}

// CheckNWFilter reports which of the kernel rules libvirt's nwfilter keeps
// for a binding on tap (see above) are missing: a jump from a built-in
// chain, a jump on the tap's physdev, a chain, or a chain that does not end
// in DROP. It checks that the rules are there, not that they are the
// instance's filter rule for rule (doctor compares the filter's
// definition with abox's). The error is for failing to look at all.
func (f *Firewall) CheckNWFilter(ctx context.Context, tap string) (Status, error) {
	var st Status
	if !tapName.MatchString(tap) {
		return st, fmt.Errorf("checking the nwfilter's rules: %q is not an interface name abox looks up", tap)
	}
	out, err := f.run.Run(ctx, "ebtables", "-t", "nat", "-L")
	if err != nil {
		return st, fmt.Errorf("checking the nwfilter's rules: %w", err)
	}
	eb := parseEbtables(string(out))
	for _, c := range []struct{ builtin, dir, chain string }{
		{"PREROUTING", "-i", "libvirt-I-" + tap},
		{"POSTROUTING", "-o", "libvirt-O-" + tap},
	} {
		if !slices.Contains(eb[c.builtin], c.dir+" "+tap+" -j "+c.chain) {
			st.Problems = append(st.Problems, fmt.Sprintf("ebtables: nat %s jump to %s missing", c.builtin, c.chain))
		}
		st.Problems = append(st.Problems, endsInDrop("ebtables: nat chain", c.chain, eb)...)
	}
	for _, tool := range f.tools {
		out, err := f.run.Run(ctx, tool, "-w", "10", "-t", "filter", "-S")
		if err != nil {
			return st, fmt.Errorf("checking the nwfilter's rules: %w", err)
		}
		ipt := parseIptables(string(out))
		for _, c := range []struct{ builtin, parent, physdev, chain string }{
			{"FORWARD", "libvirt-in", "--physdev-in", "FI-" + tap},
			{"FORWARD", "libvirt-out", "--physdev-out", "FO-" + tap},
			{"INPUT", "libvirt-host-in", "--physdev-in", "HI-" + tap},
		} {
			if !hasRule(ipt[c.builtin], "-j", c.parent) {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: filter %s jump to %s missing", tool, c.builtin, c.parent))
			}
			if !hasRule(ipt[c.parent], c.physdev, tap, "-g", c.chain) {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: filter %s jump for %s to %s missing", tool, c.parent, tap, c.chain))
			}
			st.Problems = append(st.Problems, endsInDrop(tool+": filter chain", c.chain, ipt)...)
		}
	}
	return st, nil
}

// endsInDrop is the problem with chain, if it is missing or its last rule
// is not a bare DROP.
func endsInDrop(what, chain string, chains map[string][]string) []string {
	rules, ok := chains[chain]
	switch {
	case !ok:
		return []string{fmt.Sprintf("%s %s missing", what, chain)}
	case len(rules) == 0:
		return []string{fmt.Sprintf("%s %s is empty", what, chain)}
	case rules[len(rules)-1] != "-j DROP":
		return []string{fmt.Sprintf("%s %s does not end in DROP (last rule %q)", what, chain, rules[len(rules)-1])}
	}
	return nil
}

// hasRule reports whether one of rules holds every pair of words of kv
// (option, value), each next to each other.
func hasRule(rules []string, kv ...string) bool {
	for _, r := range rules {
		w := strings.Fields(r)
		all := true
		for i := 0; i+1 < len(kv) && all; i += 2 {
			found := false
			for k := 0; k+1 < len(w); k++ {
				if w[k] == kv[i] && w[k+1] == kv[i+1] {
					found = true
					break
				}
			}
			all = found
		}
		if all {
			return true
		}
	}
	return false
}

// parseIptables maps each chain of iptables -S output to its rules,
// without the "-A CHAIN " prefix; a chain without rules maps to an empty
// list.
func parseIptables(out string) map[string][]string {
	chains := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		w := strings.Fields(l)
		switch {
		case len(w) >= 2 && (w[0] == "-N" || w[0] == "-P"):
			if _, ok := chains[w[1]]; !ok {
				chains[w[1]] = []string{}
			}
		case len(w) >= 3 && w[0] == "-A":
			chains[w[1]] = append(chains[w[1]], strings.Join(w[2:], " "))
		}
	}
	return chains
}

// parseEbtables maps each chain of ebtables -L output ("Bridge chain:
// NAME, entries: N, policy: P" and its rules, one a line) to its rules.
func parseEbtables(out string) map[string][]string {
	chains := map[string][]string{}
	cur := ""
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if name, ok := strings.CutPrefix(l, "Bridge chain: "); ok {
			cur, _, _ = strings.Cut(name, ",")
			chains[cur] = []string{}
			continue
		}
		if l == "" || strings.HasPrefix(l, "Bridge table: ") {
			cur = ""
			continue
		}
		if cur != "" {
			chains[cur] = append(chains[cur], strings.Join(strings.Fields(l), " "))
		}
	}
	return chains
}
