package dnsfilter_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
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

// TestPolicyChangeDuringLookup: a query allowed when it started is answered
// under the policy in force when its upstream answer arrives: NXDOMAIN if
// the entry was removed (or the mode switched to active) meanwhile.
func TestPolicyChangeDuringLookup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		passive bool
		change  func(h *harness) error
	}{
		{"entry removed", false, func(h *harness) error { _, err := h.pol.Remove("slow.example.org"); return err }},
		{"passive to active", true, func(h *harness) error { h.pol.SetMode(policy.Active); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, harnessOptions{passive: tc.passive, allowlist: "example.com\nslow.example.org\n"})
			if tc.passive {
				if _, err := h.pol.Remove("slow.example.org"); err != nil {
					t.Fatal(err)
				}
			}
			started, release := make(chan struct{}, 1), make(chan struct{})
			h.up.Handle("slow.example.org", func(req *dns.Msg) *dns.Msg {
				started <- struct{}{}
				<-release
				m := new(dns.Msg)
				m.SetReply(req)
				rr, _ := dns.NewRR("slow.example.org. 60 IN A 93.184.215.99")
				m.Answer = []dns.RR{rr}
				return m
			})
			got := make(chan *dns.Msg, 1)
			go func() { got <- h.ask(t, "slow.example.org", dns.TypeA) }()
			select {
			case <-started:
			case <-time.After(5 * time.Second):
				t.Fatal("query never reached the upstream")
			}
			if err := tc.change(h); err != nil {
				t.Fatal(err)
			}
			close(release)
			r := <-got
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Errorf("rcode %s answer %v, want NXDOMAIN: the answer outlived the policy change", rcode(r), r.Answer)
			}
		})
	}
}

// TestNumericNamesNeverForwarded: a query for a name that is an IP address
// in some notation is NXDOMAIN invalid_name in every mode, never forwarded.
func TestNumericNamesNeverForwarded(t *testing.T) {
	for _, passive := range []bool{false, true} {
		h := start(t, harnessOptions{passive: passive})
		for _, n := range []string{"127.0.0.1", "127.1", "0x7f.1", "2130706433", "169.254.169.254"} {
			before := h.up.Count()
			r := h.ask(t, n, dns.TypeA)
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Errorf("passive=%v %s: rcode %s answer %v, want NXDOMAIN", passive, n, rcode(r), r.Answer)
			}
			if _, text, _ := ede(r); text != "reason="+allowlist.ReasonInvalidName {
				t.Errorf("passive=%v %s: EDE %q, want reason=%s", passive, n, text, allowlist.ReasonInvalidName)
			}
			if h.up.Count() != before {
				t.Errorf("passive=%v %s: forwarded upstream", passive, n)
			}
		}
	}
}
