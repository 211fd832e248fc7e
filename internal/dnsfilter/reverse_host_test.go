package dnsfilter_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/netclass"
)

// TestReverseOfHostAddressesStaysLocal: a reverse lookup of one of the
// host's own addresses (public ones included, IPv4 and IPv6) is answered
// locally and never forwarded, in passive mode too, where every name is
// otherwise allowed: the host's resolvers may know the names of the host
// and its LAN. A public address that is not the host's is still forwarded.
func TestReverseOfHostAddressesStaysLocal(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("93.184.0.9"), netip.MustParseAddr("2001:4860:4860::9")}
	h := start(t, harnessOptions{passive: true, tweak: func(c *dnsfilter.Config) {
		c.Addrs = netclass.New(netclass.Options{Host: host})
	}})
	for _, a := range host {
		name, err := dns.ReverseAddr(a.String())
		if err != nil {
			t.Fatal(err)
		}
		name = strings.TrimSuffix(name, ".")
		before := h.up.Count()
		r := h.ask(t, name, dns.TypePTR)
		if _, text, _ := ede(r); rcode(r) != "NXDOMAIN" || text != "reason="+dnsfilter.ReasonPrivateReverse {
			t.Errorf("PTR %s (the host's %s): %s %q, want NXDOMAIN reason=%s", name, a, rcode(r), text, dnsfilter.ReasonPrivateReverse)
		}
		if h.up.Count() != before {
			t.Errorf("PTR %s of the host's own address was forwarded", name)
		}
	}
	// Nor through an alias the upstream follows.
	h.up.Add("me.example.com. 60 IN CNAME 9.0.184.93.in-addr.arpa.", "9.0.184.93.in-addr.arpa. 60 IN PTR host.corp.example.")
	if r := h.ask(t, "me.example.com", dns.TypePTR); rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
		t.Errorf("PTR of an alias of the host's reverse name: %s %v, want NXDOMAIN and nothing", rcode(r), r.Answer)
	}
	if r := h.ask(t, "14.215.184.93.in-addr.arpa", dns.TypePTR); rcode(r) != "NOERROR" || len(r.Answer) == 0 {
		t.Errorf("PTR of a public address: %s %v, want an answer", rcode(r), r.Answer)
	}
}
