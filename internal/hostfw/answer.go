package hostfw

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The answer table makes a refused flow fail at once. The chains in
// mangle drop, and nothing can answer from there: iptables' REJECT exists
// only in the filter table, which comes after mangle (and where libvirt's
// nwfilter jumps sit above anything of ours). So each bridge also has an
// nftables table of its own, one base chain of type filter on the
// prerouting hook, where nftables' reject is valid (Linux 5.9 and later).
// It sits at priority -175: after conntrack (-200), so it sees which
// packets start a flow, and before mangle (-150), where the chains drop.
// Prerouting, not input or forward: with forwarding off (a host-only
// network) a packet for a remote address never reaches the forward hook,
// the kernel's routing drops it silently. The reset and the ICMP error both carry the refused
// flow's conntrack entry (the kernel attaches it to an answer), so the
// output chain lets them through as RELATED and nothing else.
//
// With capture on, the table also holds the capture chain (captureChain),
// so that one nft transaction writes both and a table is never half of
// one: the answer chain lets TCP to port 80 and 443 of other addresses
// pass because that chain takes it to the gateway.
//
// It only answers or passes: a packet it does not answer (not the
// guest's own address, not unicast to the host, not the first of a flow,
// not TCP or UDP, allowed, or over the rate limit) goes on to the chains
// and the nwfilter, which judge it exactly as without the table. Over
// the rate limit it is dropped here. So without the table every layer
// still drops what it drops today, and the table opens nothing.

// AnswerTablePrefix starts the nftables table (family ip) of a bridge;
// the rest is the bridge name.
const AnswerTablePrefix = "abox-"

// AnswerTableName is the answer table of a bridge.
func AnswerTableName(bridge string) string { return AnswerTablePrefix + bridge }

// AnswerRate and AnswerBurst bound the answers of one bridge: at most
// AnswerBurst at once and AnswerRate per second after that, resets and
// ICMP errors together; refused packets beyond it are dropped without an
// answer. Every answer goes to the guest itself (spoofed sources are not
// answered), so a guest cannot aim them at anyone else; the limit caps
// the host's work for a guest that floods refused flows. It is ample for
// a build trying blocked hosts one after another. The kernel's own ICMP
// rate limit (net.ipv4.icmp_ratelimit, per destination) also applies to
// the ICMP errors.
const (
	AnswerRate  = 50
	AnswerBurst = 100
)

// answerPriority is the chain's place on the prerouting hook: after
// conntrack (-200), before mangle (-150).
const answerPriority = -175

// answerTable is the whole table for b, exactly as `nft list table`
// prints it (nftables 1.0.6), so that an intact table compares equal and
// Ensure leaves it alone.
func answerTable(b Bridge) string {
	gw := b.Gateway.String()
	lines := []string{
		"table ip " + AnswerTableName(b.Name) + " {",
		"\tchain answer {",
		"\t\ttype filter hook prerouting priority " + strconv.Itoa(answerPriority) + "; policy accept;",
		// Only what the guest sends the host, from its own address
		// and to the host's own unicast address: an answer goes back
		// to the source, so a spoofed source is never answered, and
		// broadcasts are not answered at all.
		"\t\tiifname != \"" + b.Name + "\" return",
		"\t\tip saddr != " + b.Guest.String() + " return",
		"\t\tmeta pkttype != host return",
		// The first packet of a flow; replies on the host's SSH
		// connections and everything else conntrack knows pass.
		"\t\tct state != new return",
		// The gateway's services (as the input chain allows them).
		"\t\tip daddr " + gw + " udp dport 53 return",
		"\t\tip daddr " + gw + " tcp dport { " + joinPorts(b.gatewayTCP()) + " } return",
	}
	if b.capturing() {
		// Captured: the capture chain below takes these to the
		// gateway's capture ports (this chain sees them before it does).
		lines = append(lines, "\t\tip daddr != "+gw+" tcp dport { 80, 443 } return")
	}
	lines = append(lines,
		// ICMP (echo to the gateway is allowed; the rest is dropped
		// by the chains) and other protocols are not answered.
		"\t\tmeta l4proto != { tcp, udp } return",
		"\t\tlimit rate over "+strconv.Itoa(AnswerRate)+"/second burst "+strconv.Itoa(AnswerBurst)+" packets drop",
		"\t\treject with tcp reset",
		"\t\treject with icmp admin-prohibited",
		"\t}",
	)
	if b.capturing() {
		lines = append(lines, captureChain(b)...)
	}
	lines = append(lines, "}")
	return strings.Join(lines, "\n") + "\n"
}

// captureChain is the nat chain that takes the guest's TCP to port 80
// and 443 of any address but the gateway to the gateway's capture ports,
// where the proxy decides each connection on the name it carries (the
// Host header, the TLS SNI), never on the address the guest chose.
// nftables runs nat chains from the kernel's one nat hook at -100
// ("dstnat"), after the answer chain (-175, which lets these through)
// and before the routing decision, so the chains in mangle INPUT and the
// nwfilter judge the flow with the gateway as its destination: the
// capture ports are gateway services like the proxy port, and no route
// out exists or is added. Without this chain such a flow is judged as
// today (dropped; forwarded nowhere).
func captureChain(b Bridge) []string {
	gw, match := b.Gateway.String(), "iifname \""+b.Name+"\" ip saddr "+b.Guest.String()+" ip daddr != "+b.Gateway.String()
	return []string{
		"",
		"\tchain capture {",
		"\t\ttype nat hook prerouting priority dstnat; policy accept;",
		"\t\t" + match + " tcp dport 80 dnat to " + gw + ":" + strconv.Itoa(int(b.CaptureHTTPPort)),
		"\t\t" + match + " tcp dport 443 dnat to " + gw + ":" + strconv.Itoa(int(b.CaptureTLSPort)),
		"\t}",
	}
}

// joinPorts writes ports as nft prints a set of them: ascending,
// comma-separated.
func joinPorts(ports []uint16) string {
	ps := slices.Clone(ports)
	slices.Sort(ps)
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = strconv.Itoa(int(p))
	}
	return strings.Join(out, ", ")
}

// answerState returns the answer table of bridge as nft prints it, or
// ok=false if it does not exist. Whether it exists is read from the list
// of tables, so that a failure of nft itself is never taken for absence.
func (f *Firewall) answerState(ctx context.Context, bridge string) (text string, ok bool, err error) {
	name := AnswerTableName(bridge)
	out, err := f.run.Run(ctx, "nft", "list", "tables", "ip")
	if err != nil {
		return "", false, fmt.Errorf("listing nftables tables: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) == "table ip "+name {
			ok = true
		}
	}
	if !ok {
		return "", false, nil
	}
	out, err = f.run.Run(ctx, "nft", "list", "table", "ip", name)
	if err != nil {
		return "", false, fmt.Errorf("listing nftables table %s: %w", name, err)
	}
	return string(out), true, nil
}

// ensureAnswer makes the answer table exist and hold exactly answerTable.
// One nft transaction creates the table if missing, deletes it and
// writes it whole, so packets see the old table or the new one.
func (f *Firewall) ensureAnswer(ctx context.Context, b Bridge) error {
	want := answerTable(b)
	have, ok, err := f.answerState(ctx, b.Name)
	if err != nil {
		return err
	}
	if ok && have == want {
		return nil
	}
	name := AnswerTableName(b.Name)
	script := "table ip " + name + "\ndelete table ip " + name + "\n" + want
	if _, err := f.run.RunInput(ctx, []byte(script), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("writing nftables table %s: %w", name, err)
	}
	return nil
}

// checkAnswer reports what is wrong with the answer table of b.
func (f *Firewall) checkAnswer(ctx context.Context, b Bridge) ([]string, error) {
	name := AnswerTableName(b.Name)
	have, ok, err := f.answerState(ctx, b.Name)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		what := "refused flows are dropped without an answer and hang until the client's timeout"
		if b.capturing() {
			what += "; proxy-unaware clients are not captured and fail"
		}
		return []string{"nft: table ip " + name + " missing (" + what + ")"}, nil
	case have != answerTable(b):
		return []string{fmt.Sprintf("nft: table ip %s holds %q, want exactly %q", name, have, answerTable(b))}, nil
	}
	return nil, nil
}

// removeAnswer deletes the answer table of bridge, if it exists.
func (f *Firewall) removeAnswer(ctx context.Context, bridge string) error {
	_, ok, err := f.answerState(ctx, bridge)
	if err != nil || !ok {
		return err
	}
	if _, err := f.run.Run(ctx, "nft", "delete", "table", "ip", AnswerTableName(bridge)); err != nil {
		return fmt.Errorf("deleting nftables table %s: %w", AnswerTableName(bridge), err)
	}
	return nil
}
