// Package hostfw owns abox's host firewall chains, per bridge and in both
// iptables and ip6tables: a FORWARD default-deny chain, an OUTPUT chain
// that lets the host send into the bridge only replies and new SSH
// connections (IPv4) or nothing (IPv6), and an INPUT chain that lets the
// guest, from its own address only, reach on the host only the gateway's
// DNS (UDP and TCP), proxy and ICMP echo, plus replies (IPv4), or nothing (IPv6);
// an nftables table that answers the guest's refused TCP and UDP at once
// and, with capture on, takes its TCP to port 80 and 443 of any address to
// the proxy's capture ports on the gateway.
package hostfw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/validate"
)

// Runner runs a program and returns its standard output. A failure must
// wrap an error with an ExitCode() int method (as *exec.ExitError has) so
// that "rule absent" (exit status 1) can be told from real failures.
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
	// RunInput is Run with input on the program's standard input (what
	// iptables-restore reads its transaction from).
	RunInput(ctx context.Context, input []byte, name string, args ...string) ([]byte, error)
}

// ExecRunner runs programs on the host with os/exec.
type ExecRunner struct{}

// Run runs name with args; a failure wraps the *exec.ExitError and carries
// the program's standard error.
func (r ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return r.RunInput(ctx, nil, name, args...)
}

// RunInput is Run with input on the program's standard input.
func (ExecRunner) RunInput(ctx context.Context, input []byte, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if input != nil {
		cmd.Stdin = bytes.NewReader(input)
	}
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
// first and survives libvirt restarting networks or filters. Likewise
// mangle/OUTPUT comes before filter/OUTPUT, for the host's own packets,
// and mangle/INPUT before filter/INPUT (where libvirt's nwfilter puts its
// host-in jumps), for what the guest sends the host itself.
const Table = "mangle"

// ChainPrefix starts the FORWARD chain of a bridge; the rest is the
// bridge name. iptables allows 28 characters, a bridge at most 15, so names
// always fit.
const ChainPrefix = "ABOX-"

// OutputChainPrefix starts the OUTPUT chain of a bridge.
const OutputChainPrefix = "ABOXO-"

// InputChainPrefix starts the INPUT chain of a bridge.
const InputChainPrefix = "ABOXI-"

// ChainName is the FORWARD chain for a bridge.
func ChainName(bridge string) string { return ChainPrefix + bridge }

// OutputChainName is the OUTPUT chain for a bridge: what the host itself
// sends into the bridge. libvirt's nwfilter sees only bridged traffic, so
// without this chain any host process could open connections to the guest.
func OutputChainName(bridge string) string { return OutputChainPrefix + bridge }

// InputChainName is the INPUT chain for a bridge: what the guest sends to
// the host itself. It repeats the nwfilter's guest-initiated allowlist, so
// that a detached or broken nwfilter does not open every service the host
// listens on (on the gateway or any other of its addresses) to the guest.
func InputChainName(bridge string) string { return InputChainPrefix + bridge }

// Bridge is what the chains of one instance depend on.
type Bridge struct {
	// Name is the bridge interface.
	Name string
	// Gateway is the host's IPv4 address on the bridge, where the guest's
	// DNS filter and proxy listen.
	Gateway netip.Addr
	// ProxyPort is the TCP port of the HTTP proxy on Gateway.
	ProxyPort uint16
	// Guest is the guest's IPv4 address, the only source the host accepts
	// from the bridge. The nwfilter's layer-2 rules refuse other sources
	// too; without this a guest whose nwfilter is gone could send the
	// host's DNS filter and proxy packets "from" a LAN host or another
	// instance's guest, and the host would send its answers there.
	Guest netip.Addr
	// ConnLimit caps the connections (conntrack entries: TCP, UDP and
	// ICMP alike) the guest may have open to the host at once; 0 means
	// DefaultConnLimit. Everything the guest sends elsewhere is dropped
	// before conntrack confirms it, so this bounds the guest's share of
	// the host's conntrack table.
	ConnLimit uint
	// CaptureHTTPPort and CaptureTLSPort are the TCP ports on Gateway
	// where the proxy takes the guest's connections to port 80 and 443
	// of any other address (answer.go, captureChain). Both 0: no
	// capture; both set otherwise, distinct from each other, from
	// ProxyPort and from 53.
	CaptureHTTPPort, CaptureTLSPort uint16
}

// capturing reports whether the bridge's port 80 and 443 are captured.
func (b Bridge) capturing() bool { return b.CaptureHTTPPort != 0 }

// gatewayTCP are the gateway's TCP services the guest may open: DNS, the
// proxy and, with capture, the capture ports.
func (b Bridge) gatewayTCP() []uint16 {
	ps := []uint16{53, b.ProxyPort}
	if b.capturing() {
		ps = append(ps, b.CaptureHTTPPort, b.CaptureTLSPort)
	}
	return ps
}

// DefaultConnLimit is generous for a build (hundreds of parallel proxy
// connections and DNS queries) and a small part of the host's conntrack
// table (nf_conntrack_max is 65536 or more).
const DefaultConnLimit = 4096

func (b Bridge) connLimit() uint {
	if b.ConnLimit == 0 {
		return DefaultConnLimit
	}
	return b.ConnLimit
}

func (b Bridge) validate() error {
	if err := validate.Bridge(b.Name); err != nil {
		return err
	}
	if !b.Gateway.Is4() || b.Gateway.IsUnspecified() {
		return fmt.Errorf("gateway %q is not an IPv4 address", b.Gateway)
	}
	if b.ProxyPort == 0 {
		return errors.New("proxy port 0")
	}
	if (b.CaptureHTTPPort == 0) != (b.CaptureTLSPort == 0) {
		return fmt.Errorf("capture ports %d and %d: set both or neither", b.CaptureHTTPPort, b.CaptureTLSPort)
	}
	if b.capturing() {
		taken := map[uint16]bool{53: true, b.ProxyPort: true}
		for _, p := range []uint16{b.CaptureHTTPPort, b.CaptureTLSPort} {
			if taken[p] {
				return fmt.Errorf("capture port %d: taken by DNS, the proxy or the other capture port; give each its own", p)
			}
			taken[p] = true
		}
	}
	if !b.Guest.Is4() || b.Guest.IsUnspecified() || b.Guest == b.Gateway {
		return fmt.Errorf("guest address %q is not an IPv4 address other than the gateway", b.Guest)
	}
	return nil
}

// jump is a rule in a built-in chain that sends a bridge's traffic to one
// of our chains.
type jump struct {
	rule []string // as given to -C, -I and -D, starting with the built-in chain
	what string   // for messages
}

// chainSpec is one chain abox owns for a bridge: what it must hold and
// where it is jumped to from.
type chainSpec struct {
	name string
	// returns are the rules, in order and without the leading "-A name",
	// that let traffic through (RETURN, so the rest of the table and the
	// filter table still apply). Each is written exactly as iptables -S
	// prints it, so that an intact chain compares equal and Ensure leaves
	// it alone. A final DROP always follows; it is not listed here.
	returns [][]string
	jumps   []jump
}

var dropSpec = []string{"-j", "DROP"}

// rules is the whole content of the chain as iptables -S prints it
// (without the -N line).
func (c chainSpec) rules() []string {
	var rs []string
	for _, r := range append(slices.Clone(c.returns), dropSpec) {
		rs = append(rs, strings.Join(append([]string{"-A", c.name}, r...), " "))
	}
	return rs
}

// specs lists the chains tool must have for b, in the order Ensure builds
// them. Remove uses only the names and jumps, which depend on b.Name alone.
func specs(tool string, b Bridge) []chainSpec {
	bridge := b.Name
	fwd, out, in := ChainName(bridge), OutputChainName(bridge), InputChainName(bridge)
	// The host may send into the bridge only replies (to the guest's DNS,
	// proxy and ICMP traffic to the gateway, and on SSH connections) and
	// new SSH connections: the design's one new inbound connection.
	// The guest may send the host only replies (on those SSH connections)
	// and what the nwfilter lets it start towards the gateway: DNS (UDP
	// and TCP), new connections to the proxy, ICMP echo requests. Every other
	// host port, and every other host address, is dropped.
	// IPv6 is dropped everywhere, so ip6tables gets the bare DROPs.
	var outReturns, inReturns [][]string
	if tool == "iptables" {
		established := []string{"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "RETURN"}
		outReturns = [][]string{
			established,
			{"-p", "tcp", "-m", "tcp", "--dport", "22", "-m", "conntrack", "--ctstate", "NEW", "-j", "RETURN"},
		}
		gw := b.Gateway.String() + "/32"
		inReturns = [][]string{
			// Only the guest's own address, before anything else: no
			// spoofed packet makes a conntrack entry, reaches a
			// listener or has the host answer to the address it
			// claims (a LAN host, another instance's guest).
			{"!", "-s", b.Guest.String() + "/32", "-j", "DROP"},
			established,
			// New connections beyond the guest's share of the host's
			// conntrack table are dropped before any is allowed; a drop
			// here happens before conntrack confirms the entry.
			{"-m", "conntrack", "--ctstate", "NEW", "-m", "connlimit", "--connlimit-above", strconv.Itoa(int(b.connLimit())), "--connlimit-mask", "0", "--connlimit-saddr", "-j", "DROP"},
			{"-d", gw, "-p", "udp", "-m", "udp", "--dport", "53", "-j", "RETURN"},
			{"-d", gw, "-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(int(b.ProxyPort)), "-m", "conntrack", "--ctstate", "NEW", "-j", "RETURN"},
			{"-d", gw, "-p", "icmp", "-m", "icmp", "--icmp-type", "8", "-j", "RETURN"},
			// DNS over TCP: the DNS filter serves it (dig sends ANY and
			// AXFR over TCP, resolvers retry a truncated answer over it),
			// with its own connection limits.
			{"-d", gw, "-p", "tcp", "-m", "tcp", "--dport", "53", "-m", "conntrack", "--ctstate", "NEW", "-j", "RETURN"},
		}
		if b.capturing() {
			// The capture ports: what the guest sent to port 80 or 443
			// of another address arrives here DNATed to them (the
			// answer table's capture chain), with the gateway as its
			// destination; nothing else is let through for it.
			for _, p := range []uint16{b.CaptureHTTPPort, b.CaptureTLSPort} {
				inReturns = append(inReturns, []string{"-d", gw, "-p", "tcp", "-m", "tcp", "--dport", strconv.Itoa(int(p)), "-m", "conntrack", "--ctstate", "NEW", "-j", "RETURN"})
			}
		}
	}
	return []chainSpec{
		{
			name: fwd,
			jumps: []jump{
				{[]string{"FORWARD", "-i", bridge, "-j", fwd}, "FORWARD jump for traffic from " + bridge},
				{[]string{"FORWARD", "-o", bridge, "-j", fwd}, "FORWARD jump for traffic to " + bridge},
			},
		},
		{
			name:    out,
			returns: outReturns,
			jumps: []jump{
				{[]string{"OUTPUT", "-o", bridge, "-j", out}, "OUTPUT jump for traffic from the host to " + bridge},
			},
		},
		{
			name:    in,
			returns: inReturns,
			jumps: []jump{
				{[]string{"INPUT", "-i", bridge, "-j", in}, "INPUT jump for traffic from " + bridge + " to the host"},
			},
		},
	}
}

// Firewall manages the chains through a Runner. The zero value is not
// usable; use New.
type Firewall struct {
	run Runner
	// tools are the binaries to program, in order: IPv4 first, since
	// that is the family the guest actually has.
	tools []string
	// bridgeNF is where the kernel's bridge netfilter switches are
	// (BridgeNetfilterDir; tests point it elsewhere).
	bridgeNF string
}

// New returns a Firewall that programs iptables and ip6tables through r.
func New(r Runner) *Firewall {
	return &Firewall{run: r, tools: []string{"iptables", "ip6tables"}, bridgeNF: BridgeNetfilterDir}
}

// arpSwitches make the host answer the guest's ARP only for addresses on
// the bridge itself, that is the gateway. By default Linux answers ARP on
// any interface for any of its addresses, so a guest could list every
// address the host has (and learn which networks it sits on) by ARPing
// for them. arp_ignore=1 answers only for addresses configured on the
// interface the request came in on; arp_announce=2 makes the host's own
// requests into the bridge use the gateway as their source. They are
// per interface and per network namespace, so they are set with sysctl
// through the Runner, in the namespace the chains are programmed in.
var arpSwitches = []ifSwitch{
	{"arp_ignore", "1"},
	{"arp_announce", "2"},
}

// arpKey is the sysctl key of a switch of bridge, in slash form so that
// no character of an interface name is read as a separator.
func arpKey(bridge, name string) string { return "net/ipv4/conf/" + bridge + "/" + name }

// arpOff lists the ARP switches of bridge that are not as wanted.
func (f *Firewall) arpOff(ctx context.Context, bridge string) ([]string, error) {
	return f.switchesOff(ctx, bridge, arpSwitches)
}

// ensureARP sets the bridge's ARP switches. They live on the bridge, so
// a bridge libvirt recreates (a network restart) needs them again: Ensure
// is what a running instance's guard calls to repair.
func (f *Firewall) ensureARP(ctx context.Context, bridge string) error {
	return f.setSwitches(ctx, bridge, arpSwitches)
}

// BridgeNetfilterDir holds net.bridge.bridge-nf-call-iptables and
// -ip6tables. They exist once br_netfilter is loaded and are per network
// namespace.
const BridgeNetfilterDir = "/proc/sys/net/bridge"

// bridgeNFSwitches must all be 1. libvirt's nwfilter writes its TCP, UDP,
// ICMP and <all/> rules (the design's whole stateful policy: which gateway
// ports the guest may reach, the one new inbound connection) as iptables
// and ip6tables rules matched with -m physdev. Bridged frames reach
// iptables, and carry the physdev information that also applies to what
// the guest sends the host itself, only through br_netfilter with these
// switches on. Without them those rules silently match nothing: the guest
// reaches every service the host has on the gateway address, and libvirt
// only logs a warning (or, with the module not loaded, says nothing).
var bridgeNFSwitches = []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"}

// bridgeNetfilterOff lists the switches that are not 1 ("missing" when
// the module is not loaded).
func (f *Firewall) bridgeNetfilterOff() ([]string, error) {
	var off []string
	for _, name := range bridgeNFSwitches {
		b, err := os.ReadFile(filepath.Join(f.bridgeNF, name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			off = append(off, "net.bridge."+name+" missing (br_netfilter not loaded)")
		case err != nil:
			return nil, fmt.Errorf("reading net.bridge.%s: %w", name, err)
		case strings.TrimSpace(string(b)) != "1":
			off = append(off, fmt.Sprintf("net.bridge.%s = %s", name, strings.TrimSpace(string(b))))
		}
	}
	return off, nil
}

// ensureBridgeNetfilter makes sure the nwfilter's iptables rules see the
// guest's traffic. A missing module is loaded (loading it turns the
// switches on); a switch an administrator turned off is not overridden
// (that would change every bridge on the host), it is refused, so that no
// guest boots with its packet filter reduced to layer 2.
func (f *Firewall) ensureBridgeNetfilter(ctx context.Context) error {
	off, err := f.bridgeNetfilterOff()
	if err != nil || len(off) == 0 {
		return err
	}
	if _, err := os.Stat(f.bridgeNF); errors.Is(err, fs.ErrNotExist) {
		if _, err := f.run.Run(ctx, "modprobe", "br_netfilter"); err != nil {
			return fmt.Errorf("loading br_netfilter, without which libvirt's nwfilter cannot see guest traffic: %w", err)
		}
		if off, err = f.bridgeNetfilterOff(); err != nil || len(off) == 0 {
			return err
		}
	}
	return fmt.Errorf("bridge netfilter is off (%s): libvirt's nwfilter would not filter the guest's IP traffic; "+
		"turn it on with `sysctl -w net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1`", strings.Join(off, ", "))
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

// restore applies lines (iptables-restore's syntax, without the table
// and COMMIT lines) to the table of tool as one transaction: they take
// effect together or not at all, so no packet sees a state in between. A
// -D in it names its rule by specification, never by number. --noflush
// keeps every other rule of the table (without it iptables-restore
// replaces the whole table); a ":CHAIN" line creates the chain or, with
// --noflush, empties it. With the legacy backend iptables-restore holds
// the xtables lock from reading the table to committing it; with
// nf_tables the kernel refuses a batch built on a ruleset that changed
// meanwhile, and iptables-restore builds it again.
func (f *Firewall) restore(ctx context.Context, tool string, lines []string) error {
	script := "*" + Table + "\n" + strings.Join(lines, "\n") + "\nCOMMIT\n"
	_, err := f.run.RunInput(ctx, []byte(script), tool+"-restore", "-w", "10", "--noflush")
	return err
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

// Ensure makes each of the bridge's chains exist and hold exactly its
// rules, ending in DROP, and be jumped to from the top of the built-in
// chain: FORWARD for traffic entering and leaving the bridge, OUTPUT for
// traffic the host itself sends into it, INPUT for traffic from the bridge
// to the host itself. It changes only what is missing or wrong, so it is
// safe to run on every start and after libvirt restarts a network. A
// chain is filled before its jumps are added, so there is never a jump
// into an empty (accepting) chain. First of all it makes sure bridge
// netfilter is on (see bridgeNFSwitches), and fails if it cannot be.
func (f *Firewall) Ensure(ctx context.Context, b Bridge) error {
	if err := b.validate(); err != nil {
		return fmt.Errorf("ensuring host firewall: %w", err)
	}
	if err := f.ensureBridgeNetfilter(ctx); err != nil {
		return fmt.Errorf("ensuring host firewall: %w", err)
	}
	if err := f.ensureARP(ctx, b.Name); err != nil {
		return fmt.Errorf("ensuring host firewall: %w", err)
	}
	for _, tool := range f.tools {
		for _, c := range specs(tool, b) {
			if err := f.ensureChain(ctx, tool, c); err != nil {
				return fmt.Errorf("ensuring %s chain %s: %w", tool, c.name, err)
			}
			for _, j := range c.jumps {
				if err := f.placeJump(ctx, tool, j); err != nil {
					return fmt.Errorf("ensuring %s %s: %w", tool, j.what, err)
				}
			}
		}
	}
	if err := f.ensureAnswer(ctx, b); err != nil {
		return fmt.Errorf("ensuring host firewall: %w", err)
	}
	return nil
}

// aboxJump matches a rule of a built-in chain that is one of abox's
// jumps, for any bridge: "-A FORWARD -i abx-x -j ABOX-abx-x".
var aboxJump = regexp.MustCompile(`^-A (FORWARD|OUTPUT|INPUT) -[io] [^ ]+ -j ` + "(" + ChainPrefix + "|" + OutputChainPrefix + "|" + InputChainPrefix + `)[^ ]+$`)

// jumpSpec is the jump as iptables -S prints it.
func (j jump) spec() string { return "-A " + strings.Join(j.rule, " ") }

// jumpFirst reports whether j is in the block of abox jumps at the top of
// its built-in chain (every rule before it is an abox jump too: their
// order does not matter, each matches only its own bridge), and how many
// copies of j the chain holds.
func (f *Firewall) jumpFirst(ctx context.Context, tool string, j jump) (first bool, present int, err error) {
	rules, _, err := f.chainRules(ctx, tool, j.rule[0])
	if err != nil {
		return false, 0, err
	}
	want := j.spec()
	inBlock := true
	for _, r := range rules {
		if strings.HasPrefix(r, "-P ") {
			continue
		}
		if r == want {
			present++
			if inBlock {
				first = true
			}
		}
		if !aboxJump.MatchString(r) {
			inBlock = false
		}
	}
	return first, present, nil
}

// placeAttempts bounds placeJump's transactions: one fails only when the
// jump's copies changed between the listing and the commit (another abox
// process repairing the same jump), and the next looks again.
const placeAttempts = 3

// placeJump makes j the one copy of itself in its built-in chain, in the
// block of abox jumps at the top. Every copy is deleted by specification
// and one is inserted at the top, in one transaction: the chain is never
// without the jump, and no rule is deleted by its number, which another
// process inserting into the shared chain between the listing and the
// change (another instance's start or remove, an administrator, this
// instance's guard during its start) would make another rule's.
func (f *Firewall) placeJump(ctx context.Context, tool string, j jump) error {
	for attempt := 1; ; attempt++ {
		first, present, err := f.jumpFirst(ctx, tool, j)
		if err != nil || first && present == 1 {
			return err
		}
		lines := make([]string, 0, present+1)
		for range present {
			lines = append(lines, "-D "+strings.Join(j.rule, " "))
		}
		lines = append(lines, "-I "+j.rule[0]+" 1 "+strings.Join(j.rule[1:], " "))
		if err = f.restore(ctx, tool, lines); err == nil || attempt == placeAttempts {
			return err
		}
	}
}

// ensureChain makes the chain exist and hold exactly c.rules(). A chain
// that does not is written whole in one transaction (created if missing,
// else emptied, then filled): a tampered chain goes from what it held to
// the wanted rules at once, never letting through more than either, and
// no rule is deleted or inserted by a number read before (another Ensure
// of the same bridge, the guard's during a start, cannot make it take the
// wrong rule).
func (f *Firewall) ensureChain(ctx context.Context, tool string, c chainSpec) error {
	have, ok, err := f.chainRules(ctx, tool, c.name)
	if err != nil {
		return err
	}
	want := c.rules()
	if ok && slices.Equal(have, want) {
		return nil
	}
	if err := f.restore(ctx, tool, append([]string{":" + c.name + " - [0:0]"}, want...)); err != nil {
		return fmt.Errorf("writing its rules: %w", err)
	}
	return nil
}

// Remove deletes the jumps and chains of the bridge named bridge; whatever
// is already gone is skipped, so it is safe to repeat and to run after a
// partial Ensure. Every step is attempted and all errors are reported.
func (f *Firewall) Remove(ctx context.Context, bridge string) error {
	if err := validate.Bridge(bridge); err != nil {
		return fmt.Errorf("removing host firewall: %w", err)
	}
	var errs []error
	if err := f.removeAnswer(ctx, bridge); err != nil {
		errs = append(errs, fmt.Errorf("removing host firewall: %w", err))
	}
	for _, tool := range f.tools {
		if err := f.removeTapDrops(ctx, tool, bridge); err != nil {
			errs = append(errs, fmt.Errorf("removing %s tap drops of %s: %w", tool, bridge, err))
		}
		for _, c := range specs(tool, Bridge{Name: bridge}) {
			errs = append(errs, f.removeChain(ctx, tool, c)...)
		}
	}
	return errors.Join(errs...)
}

func (f *Firewall) removeChain(ctx context.Context, tool string, c chainSpec) []error {
	// No chain means no jumps: iptables refuses to delete a chain that is
	// still jumped to. Probing a jump to a missing chain is an error (exit
	// status 2), not "absent", so look at the chain first.
	ok, err := f.exists(ctx, tool, "-S", c.name)
	if err != nil {
		return []error{fmt.Errorf("removing %s chain %s: %w", tool, c.name, err)}
	}
	if !ok {
		return nil
	}
	var errs []error
	for _, j := range c.jumps {
		// Loop: a crash between -C and -I elsewhere could have left a
		// duplicate jump, and -D removes one at a time.
		for i := 0; i < 16; i++ {
			ok, err := f.exists(ctx, tool, append([]string{"-C"}, j.rule...)...)
			if err != nil {
				errs = append(errs, fmt.Errorf("removing %s %s: %w", tool, j.what, err))
				break
			}
			if !ok {
				break
			}
			if err := f.ipt(ctx, tool, append([]string{"-D"}, j.rule...)...); err != nil {
				errs = append(errs, fmt.Errorf("removing %s %s: %w", tool, j.what, err))
				break
			}
		}
	}
	if err := f.ipt(ctx, tool, "-F", c.name); err != nil {
		return append(errs, fmt.Errorf("removing %s chain %s: flushing: %w", tool, c.name, err))
	}
	if err := f.ipt(ctx, tool, "-X", c.name); err != nil {
		errs = append(errs, fmt.Errorf("removing %s chain %s: deleting: %w", tool, c.name, err))
	}
	return errs
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
func (f *Firewall) Check(ctx context.Context, b Bridge) (Status, error) {
	st := Status{Bridge: b.Name}
	if err := b.validate(); err != nil {
		return st, fmt.Errorf("checking host firewall: %w", err)
	}
	off, err := f.bridgeNetfilterOff()
	if err != nil {
		return st, fmt.Errorf("checking host firewall: %w", err)
	}
	for _, o := range off {
		st.Problems = append(st.Problems, o+": the packet filter's IP rules see no guest traffic")
	}
	arp, err := f.arpOff(ctx, b.Name)
	if err != nil {
		st.Problems = append(st.Problems, err.Error())
	}
	for _, o := range arp {
		st.Problems = append(st.Problems, o+": the host answers the guest's ARP for its other addresses")
	}
	for _, tool := range f.tools {
		for _, c := range specs(tool, b) {
			rules, ok, err := f.chainRules(ctx, tool, c.name)
			if err != nil {
				return st, fmt.Errorf("checking %s chain %s: %w", tool, c.name, err)
			}
			if !ok {
				// Without the chain no jump to it can exist (and -C on
				// one would be an error), so this is the whole problem.
				st.Problems = append(st.Problems, fmt.Sprintf("%s: chain %s missing", tool, c.name))
				continue
			}
			if want := c.rules(); !slices.Equal(rules, want) {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: chain %s holds %q, want exactly %q", tool, c.name, rules, want))
			}
			for _, j := range c.jumps {
				first, present, err := f.jumpFirst(ctx, tool, j)
				if err != nil {
					return st, fmt.Errorf("checking %s %s: %w", tool, j.what, err)
				}
				switch {
				case present == 0:
					st.Problems = append(st.Problems, fmt.Sprintf("%s: %s missing", tool, j.what))
				case !first:
					st.Problems = append(st.Problems, fmt.Sprintf("%s: %s is not first in %s (another rule comes before it)", tool, j.what, j.rule[0]))
				}
			}
		}
	}
	ps, err := f.checkAnswer(ctx, b)
	if err != nil {
		return st, fmt.Errorf("checking host firewall: %w", err)
	}
	st.Problems = append(st.Problems, ps...)
	return st, nil
}
