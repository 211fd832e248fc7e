package dnsfilter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/policy"
)

// TestAliasIntoLocalNameRefused: an allowlisted name whose answer is a CNAME
// chain through a single-label, special-use or numeric name is refused whole
// (the upstream followed the alias itself, perhaps into the host's own
// network), from a fresh answer and from the cache, in both modes; an alias
// into an ordinary name is answered as before.
func TestAliasIntoLocalNameRefused(t *testing.T) {
	aliases := []string{
		"printer.local.", "gw.", "db.corp.", "x.internal.", "a.b.localhost.", "93.184.215.97.",
		"healthcheck.abox.local.", "nas.home.arpa.", "Router.LAN.",
		// Reverse names the filter never forwards: the host's resolver may
		// hold the LAN's reverse zones.
		"5.0.0.10.in-addr.arpa.", "168.192.in-addr.arpa.", "1.0.0.127.IN-ADDR.ARPA.", "d.f.ip6.arpa.",
	}
	for _, passive := range []bool{false, true} {
		h := start(t, harnessOptions{passive: passive})
		for i, target := range aliases {
			name := fmt.Sprintf("alias%d.example.com", i)
			// A hop through an ordinary name first: every link counts.
			hop := fmt.Sprintf("hop%d.example.net.", i)
			h.up.Add(name+". 60 IN CNAME "+hop, hop+" 60 IN CNAME "+target, target+" 60 IN A 93.184.215.99")
			t.Run(fmt.Sprintf("passive=%v %s", passive, target), func(t *testing.T) {
				for try := range 2 { // the second from the cache
					r := h.ask(t, name, dns.TypeA)
					if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
						t.Fatalf("try %d: rcode %s answer %v, want NXDOMAIN and nothing", try, rcode(r), r.Answer)
					}
					if _, text, ok := ede(r); !ok || !strings.HasPrefix(text, "reason="+policy.ReasonForbiddenAddress) {
						t.Errorf("try %d: EDE %q, want reason=%s", try, text, policy.ReasonForbiddenAddress)
					}
				}
			})
		}
		found := false
		for _, l := range h.logs.lines(t) {
			if l["reason"] == dnsfilter.ReasonRebinding && l["class"] == allowlist.ReasonSpecialUseAlias {
				found = true
			}
		}
		if !found {
			t.Errorf("no log line with reason %s and class %s", dnsfilter.ReasonRebinding, allowlist.ReasonSpecialUseAlias)
		}
		t.Run(fmt.Sprintf("passive=%v PTR through a private reverse name", passive), func(t *testing.T) {
			h.up.Add("rev.example.com. 60 IN CNAME 7.0.0.10.in-addr.arpa.", "7.0.0.10.in-addr.arpa. 60 IN PTR fileserver.corp.example.")
			r := h.ask(t, "rev.example.com", dns.TypePTR)
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Fatalf("rcode %s answer %v, want NXDOMAIN and nothing", rcode(r), r.Answer)
			}
		})
		t.Run(fmt.Sprintf("passive=%v alias of a public reverse name", passive), func(t *testing.T) {
			// RFC 2317 delegations alias public reverse names; an alias
			// into a complete public address is an ordinary name.
			h.up.Add("pub.example.com. 60 IN CNAME 14.215.184.93.in-addr.arpa.")
			r := h.ask(t, "pub.example.com", dns.TypePTR)
			if rcode(r) != "NOERROR" || len(r.Answer) != 2 {
				t.Errorf("rcode %s answer %v, want NOERROR with the CNAME and the PTR", rcode(r), r.Answer)
			}
		})
		t.Run(fmt.Sprintf("passive=%v ordinary alias", passive), func(t *testing.T) {
			r := h.ask(t, "www.example.com", dns.TypeA)
			if got := addrs(r); rcode(r) != "NOERROR" || len(got) != 1 || got[0] != "93.184.215.40" {
				t.Errorf("www.example.com: %s %v, want NOERROR 93.184.215.40", rcode(r), got)
			}
		})
	}
}

// TestLocalTargetsGetNoGlue: the additional addresses the upstream volunteers
// for a kept record's target are dropped when the target is a local name
// (single-label, special-use, numeric); the record itself and the glue of
// ordinary targets are kept.
func TestLocalTargetsGetNoGlue(t *testing.T) {
	h := start(t, harnessOptions{})
	h.up.Add("mx2.example.com. 60 IN MX 10 mail.local.", "mx2.example.com. 60 IN MX 20 mx.example.net.")
	h.up.AddExtra("mx2.example.com", "mail.local. 60 IN A 93.184.215.33", "mx.example.net. 60 IN A 93.184.215.34")
	r := h.ask(t, "mx2.example.com", dns.TypeMX)
	if rcode(r) != "NOERROR" || len(r.Answer) != 2 {
		t.Fatalf("MX: %s %v, want both MX records", rcode(r), r.Answer)
	}
	var glue []string
	for _, rr := range r.Extra {
		if a, ok := rr.(*dns.A); ok {
			glue = append(glue, a.Hdr.Name+" "+a.A.String())
		}
	}
	if len(glue) != 1 || glue[0] != "mx.example.net. 93.184.215.34" {
		t.Errorf("additional addresses %v, want only mx.example.net's", glue)
	}
}
