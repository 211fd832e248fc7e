package libvirt

import (
	"encoding/xml"
	"fmt"
	"strconv"

	"libvirt.org/go/libvirtxml"
)

// Rule priorities. libvirt orders a filter's rules by priority (lower
// first) and places each in the layer its protocol belongs to: mac, arp,
// ip and ipv6 rules (and rules without a protocol) become ebtables rules
// on the bridge port; tcp, udp, icmp and all become iptables rules, and
// *-ipv6 ip6tables rules. Each layer must accept a packet for it to pass,
// so the two lists below are two independent, explicitly ordered policies.
// Zero is never used: libvirtxml omits it and libvirt then applies 500.
const (
	// Layer 2 (ebtables): anti-spoofing and IPv6/other-protocol hygiene.
	prioL2DropIPv6Out  = -900
	prioL2DropIPv6In   = -899
	prioL2IPv4Out      = -800
	prioL2IPv4In       = -799
	prioL2ARPOut       = -700
	prioL2ARPIn        = -699
	prioL2DropOtherOut = -600
	prioL2DropOtherIn  = -599
	// Layer 3/4 (iptables, ip6tables): the design's stateful policy.
	prioEstablishedIn  = 100
	prioEstablishedOut = 101
	prioSSHIn          = 200
	prioDNSOut         = 300
	prioProxyOut       = 301
	prioICMPOut        = 302
	prioDNSTCPOut      = 303
	prioCaptureOut     = 304 // and 305
	prioDropIPv6In     = 900
	prioDropIPv6Out    = 901
	prioDropAllIn      = 998
	prioDropAllOut     = 999
)

func field(s string) libvirtxml.NWFilterField { return libvirtxml.NWFilterField{Str: s} }

// BuildNWFilter returns the instance's packet filter: the security
// design's stateful default-deny policy rule for rule, plus the layer-2
// rules it leaves out.
//
// Anti-spoofing is written out here rather than taken from libvirt's
// clean-traffic filter. clean-traffic (as Debian's libvirt 9.0 ships it)
// learns the guest's IP from its first packets when $IP is not passed,
// which lets a hostile guest pick its own address; it accepts any UDP sent
// from 0.0.0.0 (for DHCP, which abox does not use) and every incoming IPv4
// and ARP frame; and its content is the distribution's to change. Our own
// rules admit exactly one MAC and one IP, both ways, and show up in the
// golden file.
//
// Values are concrete, not $IP/$MAC/$GATEWAY/$PROXY_PORT parameters: the
// filter is per instance anyway (its name carries the instance), so
// parameters buy nothing, while a domain definition that references the
// filter without them (a user template, a hand edit) would leave libvirt to
// learn IP and MAC from the guest. With concrete values the <filterref>
// alone is enough for the full policy, wherever it appears.
func BuildNWFilter(p Params) (*libvirtxml.NWFilter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	mac, ip, gw := field(p.MAC), field(p.GuestIP.String()), field(p.Gateway.String())
	newConn, established := field("NEW"), field("ESTABLISHED,RELATED")

	rules := []*libvirtxml.NWFilterRule{
		// IPv6 is dropped at layer 2 both ways: the design's <all/>
		// rules are IPv4 only, and libvirt disabling IPv6 on the bridge
		// only stops the host from answering, not the guest from sending.
		{Action: "drop", Direction: "out", Priority: prioL2DropIPv6Out, IPv6: &libvirtxml.NWFilterRuleIPv6{}},
		{Action: "drop", Direction: "in", Priority: prioL2DropIPv6In, IPv6: &libvirtxml.NWFilterRuleIPv6{}},

		// IPv4 leaves the guest only with its own MAC and IP as source,
		// and reaches it only addressed to its IP.
		{Action: "accept", Direction: "out", Priority: prioL2IPv4Out, IP: &libvirtxml.NWFilterRuleIP{
			NWFilterRuleCommonMAC: libvirtxml.NWFilterRuleCommonMAC{SrcMACAddr: mac},
			SrcIPAddr:             ip,
		}},
		{Action: "accept", Direction: "in", Priority: prioL2IPv4In, IP: &libvirtxml.NWFilterRuleIP{
			DstIPAddr: ip,
		}},

		// ARP only about the guest itself: frame and ARP sender are the
		// guest's MAC, the ARP sender address its IP. This stops ARP
		// poisoning of the gateway's cache (claiming another IP). Inbound
		// ARP must target the guest's IP (requests for it, replies to it).
		{Action: "accept", Direction: "out", Priority: prioL2ARPOut, ARP: &libvirtxml.NWFilterRuleARP{
			NWFilterRuleCommonMAC: libvirtxml.NWFilterRuleCommonMAC{SrcMACAddr: mac},
			ARPSrcMACAddr:         mac,
			ARPSrcIPAddr:          ip,
		}},
		{Action: "accept", Direction: "in", Priority: prioL2ARPIn, ARP: &libvirtxml.NWFilterRuleARP{
			ARPDstIPAddr: ip,
		}},

		// Every other frame (spoofed IPv4 or ARP, VLAN tags, STP BPDUs
		// against the bridge, which has STP off so that BPDUs get here,
		// raw ethertypes) is dropped. A rule without
		// a protocol matches every frame at layer 2.
		{Action: "drop", Direction: "out", Priority: prioL2DropOtherOut},
		{Action: "drop", Direction: "in", Priority: prioL2DropOtherIn},

		// The design's policy, rule for rule, from here on.
		// Return traffic for established connections, both directions.
		{Action: "accept", Direction: "in", Priority: prioEstablishedIn, All: &libvirtxml.NWFilterRuleAll{
			NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: established},
		}},
		{Action: "accept", Direction: "out", Priority: prioEstablishedOut, All: &libvirtxml.NWFilterRuleAll{
			NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{State: established},
		}},
		// Host->guest SSH, the only new inbound connection.
		{Action: "accept", Direction: "in", Priority: prioSSHIn, TCP: &libvirtxml.NWFilterRuleTCP{
			NWFilterRuleCommonIP:   libvirtxml.NWFilterRuleCommonIP{State: newConn},
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: field("22")},
		}},
		// Guest-initiated: DNS, the HTTP proxy and ICMP, to the gateway only.
		// (DNS over TCP follows the ICMP rule.)
		{Action: "accept", Direction: "out", Priority: prioDNSOut, UDP: &libvirtxml.NWFilterRuleUDP{
			NWFilterRuleCommonIP:   libvirtxml.NWFilterRuleCommonIP{DstIPAddr: gw, State: newConn},
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: field("53")},
		}},
		{Action: "accept", Direction: "out", Priority: prioProxyOut, TCP: &libvirtxml.NWFilterRuleTCP{
			NWFilterRuleCommonIP:   libvirtxml.NWFilterRuleCommonIP{DstIPAddr: gw, State: newConn},
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: field(strconv.Itoa(int(p.ProxyPort)))},
		}},
		// Echo requests only (as the host's input chain): of the other
		// ICMP requests conntrack calls NEW, the host would answer a
		// timestamp request with its clock.
		{Action: "accept", Direction: "out", Priority: prioICMPOut, ICMP: &libvirtxml.NWFilterRuleICMP{
			NWFilterRuleCommonIP: libvirtxml.NWFilterRuleCommonIP{DstIPAddr: gw, State: newConn},
			Type:                 field("8"),
		}},
		// DNS over TCP to the gateway: the DNS filter serves it (dig
		// sends ANY and AXFR over TCP; resolvers retry a truncated answer
		// over it). Dropping it left such queries hanging.
		{Action: "accept", Direction: "out", Priority: prioDNSTCPOut, TCP: &libvirtxml.NWFilterRuleTCP{
			NWFilterRuleCommonIP:   libvirtxml.NWFilterRuleCommonIP{DstIPAddr: gw, State: newConn},
			NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: field("53")},
		}},
	}
	if p.CaptureHTTPPort != 0 {
		// The capture ports, to the gateway only. The host DNATs the
		// guest's TCP to port 80 and 443 of other addresses to them
		// before this filter judges it (nat prerouting comes before the
		// filter table), so what it sees is a flow to the gateway like
		// one to the proxy; a flow to any other address stays refused,
		// with or without the host's capture rule.
		for i, port := range []uint16{p.CaptureHTTPPort, p.CaptureTLSPort} {
			rules = append(rules, &libvirtxml.NWFilterRule{Action: "accept", Direction: "out", Priority: prioCaptureOut + i, TCP: &libvirtxml.NWFilterRuleTCP{
				NWFilterRuleCommonIP:   libvirtxml.NWFilterRuleCommonIP{DstIPAddr: gw, State: newConn},
				NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: field(strconv.Itoa(int(port)))},
			}})
		}
	}
	rules = append(rules,
		// IPv6 again at layer 3 (ip6tables): if the layer-2 drop were ever
		// lost, IPv6 would otherwise pass, as <all/> does not cover it.
		&libvirtxml.NWFilterRule{Action: "drop", Direction: "in", Priority: prioDropIPv6In, AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{}},
		&libvirtxml.NWFilterRule{Action: "drop", Direction: "out", Priority: prioDropIPv6Out, AllIPv6: &libvirtxml.NWFilterRuleAllIPv6{}},
		// Default deny, both directions.
		&libvirtxml.NWFilterRule{Action: "drop", Direction: "in", Priority: prioDropAllIn, All: &libvirtxml.NWFilterRuleAll{}},
		&libvirtxml.NWFilterRule{Action: "drop", Direction: "out", Priority: prioDropAllOut, All: &libvirtxml.NWFilterRuleAll{}},
	)

	f := &libvirtxml.NWFilter{
		Name:  FilterName(p.Name),
		UUID:  derivedUUID("nwfilter", p.UUID),
		Chain: "root",
	}
	for _, r := range rules {
		f.Entries = append(f.Entries, libvirtxml.NWFilterEntry{Rule: r})
	}
	return f, nil
}

// NWFilterXML is BuildNWFilter marshalled to libvirt's XML.
func NWFilterXML(p Params) (string, error) {
	f, err := BuildNWFilter(p)
	if err != nil {
		return "", err
	}
	s, err := f.Marshal()
	if err != nil {
		return "", fmt.Errorf("encoding nwfilter for %q: %w", p.Name, err)
	}
	return s, nil
}

// SameNWFilterRules compares the rules of two filters as libvirt would
// apply them (the defined filter against the one BuildNWFilter makes).
func SameNWFilterRules(got, want *libvirtxml.NWFilter) bool {
	if len(got.Entries) != len(want.Entries) {
		return false
	}
	for i := range got.Entries {
		a, err1 := xml.Marshal(got.Entries[i])
		b, err2 := xml.Marshal(want.Entries[i])
		if err1 != nil || err2 != nil || string(a) != string(b) {
			return false
		}
	}
	return true
}
