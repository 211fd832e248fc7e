package dnsfilter_test

import (
	"fmt"
	"testing"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
)

// TestSpecialUseNeverForwarded: single-label names and names in local or
// special-use zones are answered NXDOMAIN with reason special_use_name and
// never reach the upstream, in active and passive mode, even when the
// upstream has an answer for them.
func TestSpecialUseNeverForwarded(t *testing.T) {
	names := []string{
		"_gateway", "wpad", "localhost", "db.localhost", "printer.local", "metadata.google.internal",
		"router.home.arpa", "nas.lan", "files.corp", "x.localdomain", "abc.onion", "svc.alt",
		"_dns.resolver.arpa", "ipv4only.arpa", "HOST.Internal.",
	}
	for _, passive := range []bool{false, true} {
		h := start(t, harnessOptions{passive: passive, allowlist: "example.com\n*.example.com\n"})
		for _, n := range names {
			h.up.Add(fmt.Sprintf("%s 60 IN A 93.184.215.77", dns.Fqdn(n)))
		}
		for _, n := range names {
			t.Run(fmt.Sprintf("passive=%v %s", passive, n), func(t *testing.T) {
				before := h.up.Count()
				r := h.ask(t, n, dns.TypeA)
				if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
					t.Errorf("rcode %s answer %v, want NXDOMAIN and nothing", rcode(r), r.Answer)
				}
				if _, text, ok := ede(r); !ok || text != "reason="+allowlist.ReasonSpecialUse {
					t.Errorf("EDE text %q, want reason=%s", text, allowlist.ReasonSpecialUse)
				}
				if h.up.Count() != before {
					t.Errorf("%s reached the upstream", n)
				}
			})
		}
		if passive {
			for _, e := range h.pol.Profile().Entries {
				t.Errorf("passive profile recorded special-use name %q", e.Name)
			}
		}
	}
}

// TestHealthcheckExactName: only healthcheck.abox.local itself is answered
// locally; names that merely start or end like it are ordinary names,
// decided by the allowlist (a prefix or suffix match would let
// healthcheck.abox.local.evil.test through active mode).
func TestHealthcheckExactName(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "example.com\n"})
	h.up.Add("healthcheck.abox.local.evil.test. 60 IN A 93.184.215.66", "xhealthcheck.abox.local.evil.test. 60 IN A 93.184.215.67")
	for _, n := range []string{"healthcheck.abox.local.evil.test", "healthcheck.abox.localx", "xhealthcheck.abox.local", "healthcheck.abox.local.example.com.evil.test"} {
		t.Run(n, func(t *testing.T) {
			before := h.up.Count()
			r := h.ask(t, n, dns.TypeA)
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Errorf("rcode %s answer %v, want NXDOMAIN: not allowlisted", rcode(r), r.Answer)
			}
			if _, text, _ := ede(r); text == "reason=healthcheck" {
				t.Errorf("answered as the healthcheck")
			}
			if h.up.Count() != before {
				t.Errorf("forwarded although not allowlisted")
			}
		})
	}
}
