package hostfw

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"strings"

	"github.com/abox-dev/abox/internal/validate"
)

// Port is a running guest's tap device on the host, the other end of its
// only network link. libvirt plugs it into the bridge when the guest
// starts; when the network is restarted (virsh net-destroy + net-start, a
// libvirt upgrade) libvirt recreates the bridge and leaves the tap out of
// it. A tap outside the bridge is an ordinary host interface: the nwfilter
// filters bridged traffic only and the host chains match the bridge, so
// the guest's packets would reach the host's own IP stack unfiltered.
// EnsurePort therefore drops, at the IP layer, everything the tap receives
// outside a bridge, makes the host answer no ARP on it, and plugs it back.
type Port struct {
	Bridge string // the instance's bridge
	// GuestMAC is the guest's MAC address; its tap is the interface with
	// TapMAC(GuestMAC).
	GuestMAC string
}

// TapMAC is the address libvirt gives a guest's tap: the guest's with the
// first octet 0xfe (so the bridge never takes a tap's address as its own).
func TapMAC(guest string) (string, error) {
	hw, err := net.ParseMAC(guest)
	if err != nil || len(hw) != 6 {
		return "", fmt.Errorf("guest MAC %q is not an Ethernet address", guest)
	}
	hw[0] = 0xfe
	return hw.String(), nil
}

// portSwitches are set on the tap itself. They do nothing while it is a
// bridge port (a port does no IP); outside the bridge arp_ignore=8 makes
// the host answer no ARP on it (the highest value, so it counts whatever
// conf/all says).
var portSwitches = []ifSwitch{{"arp_ignore", "8"}}

// tapDrops are the jumps that send everything a tap receives as a host
// interface (never bridged traffic: for that iptables' -i is the bridge)
// to the bridge's FORWARD chain, which drops all.
func tapDrops(b, tap string) []jump {
	fwd := ChainName(b)
	return []jump{
		{[]string{"INPUT", "-i", tap, "-j", fwd}, "INPUT drop for " + tap + " outside its bridge"},
		{[]string{"FORWARD", "-i", tap, "-j", fwd}, "FORWARD drop for " + tap + " outside its bridge"},
	}
}

type link struct {
	Name    string `json:"ifname"`
	Master  string `json:"master"`
	Address string `json:"address"`
}

// tapOf finds the interface with the tap's MAC; "" when there is none
// (the guest has no link, so nothing to guard).
func (f *Firewall) tapOf(ctx context.Context, p Port) (link, error) {
	if err := validate.Bridge(p.Bridge); err != nil {
		return link{}, err
	}
	mac, err := TapMAC(p.GuestMAC)
	if err != nil {
		return link{}, err
	}
	out, err := f.run.Run(ctx, "ip", "-j", "link", "show")
	if err != nil {
		return link{}, fmt.Errorf("listing interfaces: %w", err)
	}
	var links []link
	if err := json.Unmarshal(out, &links); err != nil {
		return link{}, fmt.Errorf("listing interfaces: ip -j printed %.80q: %w", out, err)
	}
	for _, l := range links {
		// A bridge without an address of its own (libvirt gives its
		// bridges one) takes its first port's.
		if strings.EqualFold(l.Address, mac) && l.Name != p.Bridge {
			if !tapName.MatchString(l.Name) {
				return link{}, fmt.Errorf("the guest's tap has the name %q, which abox does not use in rules", l.Name)
			}
			return l, nil
		}
	}
	return link{}, nil
}

// tapName is what a tap name may be before it goes into an iptables rule.
var tapName = regexp.MustCompile(`^[a-zA-Z0-9_.-]{1,15}$`)

// CheckPort reports what is wrong with the guest's port: the tap outside
// its bridge, its drop jumps missing or not among abox's jumps at the top,
// its ARP switch off. No tap at all is no problem (no link to guard).
func (f *Firewall) CheckPort(ctx context.Context, p Port) (Status, error) {
	st := Status{Bridge: p.Bridge}
	tap, err := f.tapOf(ctx, p)
	if err != nil || tap.Name == "" {
		return st, err
	}
	if tap.Master != p.Bridge {
		st.Problems = append(st.Problems, fmt.Sprintf("tap %s is not a port of %s (master %q): a network restart left it out, and outside the bridge the guest's packets reach the host's IP stack unfiltered", tap.Name, p.Bridge, tap.Master))
	}
	for _, tool := range f.tools {
		for _, j := range tapDrops(p.Bridge, tap.Name) {
			first, present, err := f.jumpFirst(ctx, tool, j)
			if err != nil {
				return st, fmt.Errorf("checking %s %s: %w", tool, j.what, err)
			}
			if present == 0 || !first {
				st.Problems = append(st.Problems, fmt.Sprintf("%s: %s missing or not first", tool, j.what))
			}
		}
	}
	off, err := f.switchesOff(ctx, tap.Name, portSwitches)
	if err != nil {
		return st, err
	}
	st.Problems = append(st.Problems, off...)
	return st, nil
}

// EnsurePort makes the tap inert outside the bridge (drop jumps, ARP
// switch), drops the jumps of the bridge's former taps, then plugs the tap
// back into the bridge if it is out. Safe to repeat.
func (f *Firewall) EnsurePort(ctx context.Context, p Port) error {
	tap, err := f.tapOf(ctx, p)
	if err != nil || tap.Name == "" {
		return err
	}
	drops := tapDrops(p.Bridge, tap.Name)
	for _, tool := range f.tools {
		if _, ok, err := f.chainRules(ctx, tool, ChainName(p.Bridge)); err != nil || !ok {
			return fmt.Errorf("ensuring %s's port: %s chain %s missing (%v): run Ensure first", tap.Name, tool, ChainName(p.Bridge), err)
		}
		for _, j := range drops {
			if err := f.placeJump(ctx, tool, j); err != nil {
				return fmt.Errorf("ensuring %s %s: %w", tool, j.what, err)
			}
		}
		if err := f.removeStaleTapDrops(ctx, tool, p.Bridge, tap.Name); err != nil {
			return err
		}
	}
	if err := f.setSwitches(ctx, tap.Name, portSwitches); err != nil {
		return err
	}
	if tap.Master != p.Bridge {
		if _, err := f.run.Run(ctx, "ip", "link", "set", "dev", tap.Name, "master", p.Bridge); err != nil {
			return fmt.Errorf("plugging tap %s back into %s: %w", tap.Name, p.Bridge, err)
		}
	}
	return nil
}

// removeStaleTapDrops deletes the drop jumps into the bridge's FORWARD
// chain for interfaces other than the bridge and keep (taps of the
// guest's earlier runs; keep's own copies are placeJump's). Each goes by
// specification, never by rule number: the built-in chains are shared,
// and a rule another process inserts between the listing and the delete
// would shift the numbers onto a rule not abox's. All copies of a stale
// drop are alike, so whichever -D takes is right; one already gone
// (another abox process removed it) is no error.
func (f *Firewall) removeStaleTapDrops(ctx context.Context, tool, bridge, keep string) error {
	for _, builtin := range []string{"INPUT", "FORWARD"} {
		rules, _, err := f.chainRules(ctx, tool, builtin)
		if err != nil {
			return err
		}
		for _, r := range rules {
			w := strings.Fields(r)
			if len(w) != 6 || w[0] != "-A" || w[1] != builtin || w[2] != "-i" || w[4] != "-j" || w[5] != ChainName(bridge) || w[3] == bridge || w[3] == keep {
				continue
			}
			if err := f.ipt(ctx, tool, append([]string{"-D"}, w[1:]...)...); err != nil && !absent(err) {
				return fmt.Errorf("removing %s rule %q: %w", tool, r, err)
			}
		}
	}
	return nil
}

// removeTapDrops deletes every drop jump into the bridge's FORWARD chain
// (Remove calls it before deleting the chain, which iptables refuses while
// anything jumps to it).
func (f *Firewall) removeTapDrops(ctx context.Context, tool, bridge string) error {
	return f.removeStaleTapDrops(ctx, tool, bridge, "")
}

// switch is a per-interface IPv4 sysctl and the value abox wants.
type ifSwitch struct{ name, value string }

// switchesOff lists the switches of dev that are not as wanted.
func (f *Firewall) switchesOff(ctx context.Context, dev string, sws []ifSwitch) ([]string, error) {
	args := []string{"-n"}
	for _, sw := range sws {
		args = append(args, arpKey(dev, sw.name))
	}
	out, err := f.run.Run(ctx, "sysctl", args...)
	if err != nil {
		return nil, fmt.Errorf("reading the switches of %s: %w", dev, err)
	}
	vals := strings.Fields(string(out))
	if len(vals) != len(sws) {
		return nil, fmt.Errorf("reading the switches of %s: sysctl printed %q", dev, out)
	}
	var off []string
	for i, sw := range sws {
		if vals[i] != sw.value {
			off = append(off, fmt.Sprintf("net.ipv4.conf.%s.%s = %s, want %s", dev, sw.name, vals[i], sw.value))
		}
	}
	return off, nil
}

// setSwitches sets the switches of dev that are not as wanted.
func (f *Firewall) setSwitches(ctx context.Context, dev string, sws []ifSwitch) error {
	off, err := f.switchesOff(ctx, dev, sws)
	if err != nil || len(off) == 0 {
		return err
	}
	args := []string{"-q", "-w"}
	var want []string
	for _, sw := range sws {
		args = append(args, arpKey(dev, sw.name)+"="+sw.value)
		want = append(want, sw.name+"="+sw.value)
	}
	if _, err := f.run.Run(ctx, "sysctl", args...); err != nil {
		return fmt.Errorf("setting %s on %s: %w", strings.Join(want, ", "), dev, err)
	}
	return nil
}
