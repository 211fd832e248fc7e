package dnsfilter_test

import (
	"github.com/abox-dev/abox/internal/decisionlog"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestNames covers the name policy end to end: allowlisted and blocked
// names, case, wildcard depth, apex versus wildcard, look-alikes, punycode
// and invalid names. A blocked name must never reach the upstream.
func TestNames(t *testing.T) {
	h := start(t, harnessOptions{})
	tests := []struct {
		name      string
		qname     string
		wantRcode string
		wantAddrs []string
		// wantEDE is the EDE text of a block.
		wantEDE string
	}{
		{name: "apex allowed", qname: "example.com", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.14"}},
		{name: "mixed case", qname: "ExAmPlE.CoM", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.14"}},
		{name: "entry written with case and trailing dot", qname: "other.example.net", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.50"}},
		{name: "wildcard one label", qname: "a.example.com", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.30"}},
		{name: "wildcard three labels deep", qname: "a.b.c.example.com", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.31"}},
		{name: "wildcard does not allow its apex", qname: "wild.test", wantRcode: "NXDOMAIN", wantEDE: "reason=not_allowlisted"},
		{name: "wildcard below apex", qname: "a.wild.test", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.61"}},
		{name: "look-alike prefix", qname: "evil-example.com", wantRcode: "NXDOMAIN", wantEDE: "reason=not_allowlisted"},
		{name: "look-alike suffix", qname: "example.com.evil.test", wantRcode: "NXDOMAIN", wantEDE: "reason=not_allowlisted"},
		{name: "not allowlisted", qname: "other.org", wantRcode: "NXDOMAIN", wantEDE: "reason=not_allowlisted"},
		{name: "punycode of a unicode entry", qname: "xn--bcher-kva.com", wantRcode: "NOERROR", wantAddrs: []string{"93.184.215.70"}},
		{name: "raw utf-8 on the wire is invalid", qname: "bücher.com", wantRcode: "NXDOMAIN", wantEDE: "reason=invalid_name"},
		{name: "escaped dot inside a label", qname: `example\.com.evil.test`, wantRcode: "NXDOMAIN", wantEDE: "reason=invalid_name"},
		{name: "root", qname: ".", wantRcode: "NXDOMAIN", wantEDE: "reason=invalid_name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := h.up.Count()
			r := h.ask(t, tt.qname, dns.TypeA)
			if got := rcode(r); got != tt.wantRcode {
				t.Fatalf("%s A: rcode %s, want %s", tt.qname, got, tt.wantRcode)
			}
			if got := addrs(r); !slices.Equal(got, tt.wantAddrs) {
				t.Errorf("%s A: addresses %v, want %v", tt.qname, got, tt.wantAddrs)
			}
			code, text, ok := ede(r)
			if tt.wantEDE == "" {
				if ok {
					t.Errorf("%s: unexpected EDE %d %q", tt.qname, code, text)
				}
				return
			}
			if !ok || code != dns.ExtendedErrorCodeBlocked || text != tt.wantEDE {
				t.Errorf("%s: EDE %d %q (present %v), want %d %q", tt.qname, code, text, ok, dns.ExtendedErrorCodeBlocked, tt.wantEDE)
			}
			if n := h.up.Count() - before; n != 0 {
				t.Errorf("%s is blocked but the upstream got %d queries", tt.qname, n)
			}
		})
	}
}

// TestEDEOnlyWithEDNS: a client without EDNS gets a plain NXDOMAIN (an OPT
// record it did not ask for would be a protocol error).
func TestEDEOnlyWithEDNS(t *testing.T) {
	h := start(t, harnessOptions{})
	r := h.exchange(t, query("other.org", dns.TypeA, 0), "udp")
	if rcode(r) != "NXDOMAIN" || r.IsEdns0() != nil {
		t.Fatalf("blocked query without EDNS: rcode %s, OPT %v; want NXDOMAIN without OPT", rcode(r), r.IsEdns0())
	}
	r = h.exchange(t, query("other.org", dns.TypeA, 512), "udp")
	if _, text, ok := ede(r); !ok || text != "reason=not_allowlisted" {
		t.Fatalf("blocked query with EDNS: EDE %q present %v, want reason=not_allowlisted", text, ok)
	}
}

// TestQueryTypes: every common type is answered for an allowed name and
// blocked, without an upstream query, for a blocked one.
func TestQueryTypes(t *testing.T) {
	h := start(t, harnessOptions{})
	tests := []struct {
		qtype   uint16
		allowed string
		// wantType is the record type the answer must hold.
		wantType uint16
	}{
		{dns.TypeA, "example.com", dns.TypeA},
		{dns.TypeAAAA, "example.com", dns.TypeAAAA},
		{dns.TypeTXT, "example.com", dns.TypeTXT},
		{dns.TypeMX, "example.com", dns.TypeMX},
		{dns.TypeSRV, "_sip._tcp.example.com", dns.TypeSRV},
		{dns.TypeANY, "example.com", dns.TypeA},
		{dns.TypeHTTPS, "example.com", dns.TypeHTTPS},
		{dns.TypePTR, "example.com", dns.TypePTR},
		{dns.TypePTR, "14.215.184.93.in-addr.arpa", dns.TypePTR},
	}
	for _, tt := range tests {
		t.Run(dns.TypeToString[tt.qtype]+" "+tt.allowed, func(t *testing.T) {
			r := h.ask(t, tt.allowed, tt.qtype)
			if rcode(r) != "NOERROR" {
				t.Fatalf("allowed %s %s: rcode %s, want NOERROR", tt.allowed, dns.TypeToString[tt.qtype], rcode(r))
			}
			found := false
			for _, rr := range r.Answer {
				found = found || rr.Header().Rrtype == tt.wantType
			}
			if !found {
				t.Errorf("allowed %s %s: answer %v holds no %s", tt.allowed, dns.TypeToString[tt.qtype], r.Answer, dns.TypeToString[tt.wantType])
			}
			before := h.up.Count()
			r = h.ask(t, "other.org", tt.qtype)
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Errorf("blocked other.org %s: rcode %s, %d answers; want NXDOMAIN, none", dns.TypeToString[tt.qtype], rcode(r), len(r.Answer))
			}
			if n := h.up.Count() - before; n != 0 {
				t.Errorf("blocked other.org %s reached the upstream %d times", dns.TypeToString[tt.qtype], n)
			}
		})
	}
}

// TestProtocolRefusals: nothing but a plain one-question IN query is
// interpreted, and none of the rest reaches the upstream.
func TestProtocolRefusals(t *testing.T) {
	h := start(t, harnessOptions{})
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	tests := []struct {
		name      string
		msg       func() *dns.Msg
		network   string
		wantRcode int
		wantEDE   string
	}{
		{name: "two questions", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Question = append(m.Question, dns.Question{Name: "other.org.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
			return m
		}},
		{name: "allowed then blocked question", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 1232)
			m.Question = append(m.Question, dns.Question{Name: "evil.test.", Qtype: dns.TypeTXT, Qclass: dns.ClassINET})
			return m
		}},
		{name: "no question", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Question = nil
			return m
		}},
		{name: "UPDATE", wantRcode: dns.RcodeRefused, wantEDE: "reason=opcode_refused", msg: func() *dns.Msg {
			m := new(dns.Msg)
			m.SetUpdate("example.com.")
			m.Insert([]dns.RR{rr("evil.example.com. 60 IN A 10.0.0.1")})
			m.SetEdns0(1232, false)
			return m
		}},
		{name: "NOTIFY", wantRcode: dns.RcodeRefused, msg: func() *dns.Msg {
			m := new(dns.Msg)
			m.SetNotify("example.com.")
			return m
		}},
		{name: "IQUERY", wantRcode: dns.RcodeNotImplemented, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Opcode = dns.OpcodeIQuery
			return m
		}},
		{name: "STATUS", wantRcode: dns.RcodeNotImplemented, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Opcode = dns.OpcodeStatus
			return m
		}},
		{name: "CHAOS version.bind", wantRcode: dns.RcodeRefused, wantEDE: "reason=class_refused", msg: func() *dns.Msg {
			m := query("version.bind", dns.TypeTXT, 1232)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		}},
		{name: "CHAOS on an allowed name", wantRcode: dns.RcodeRefused, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeTXT, 0)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		}},
		{name: "HESIOD", wantRcode: dns.RcodeRefused, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeTXT, 0)
			m.Question[0].Qclass = dns.ClassHESIOD
			return m
		}},
		{name: "class ANY", wantRcode: dns.RcodeRefused, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Question[0].Qclass = dns.ClassANY
			return m
		}},
		{name: "AXFR over TCP", network: "tcp", wantRcode: dns.RcodeRefused, wantEDE: "reason=zone_transfer", msg: func() *dns.Msg {
			return query("example.com", dns.TypeAXFR, 1232)
		}},
		{name: "IXFR", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeIXFR, 0)
			m.Ns = []dns.RR{rr("example.com. 60 IN SOA ns.example.com. h.example.com. 1 2 3 4 5")}
			return m
		}},
		{name: "TKEY meta type", wantRcode: dns.RcodeRefused, msg: func() *dns.Msg { return query("example.com", dns.TypeTKEY, 0) }},
		{name: "answer records in a query", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Answer = []dns.RR{rr("example.com. 60 IN A 10.0.0.1")}
			return m
		}},
		{name: "stray additional record", wantRcode: dns.RcodeFormatError, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 0)
			m.Extra = []dns.RR{rr("smuggled.example.com. 60 IN TXT \"x\"")}
			return m
		}},
		{name: "EDNS version 1", wantRcode: dns.RcodeBadVers, msg: func() *dns.Msg {
			m := query("example.com", dns.TypeA, 1232)
			m.IsEdns0().SetVersion(1)
			return m
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			network := tt.network
			if network == "" {
				network = "udp"
			}
			before := h.up.Count()
			req := tt.msg()
			r := h.exchange(t, req, network)
			if r.Rcode != tt.wantRcode {
				t.Fatalf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[tt.wantRcode])
			}
			if len(r.Answer) != 0 {
				t.Errorf("refused query got answers %v", r.Answer)
			}
			if len(r.Question) > 1 {
				t.Errorf("response echoes %d questions, want at most 1", len(r.Question))
			}
			if tt.wantEDE != "" {
				if _, text, ok := ede(r); !ok || text != tt.wantEDE {
					t.Errorf("EDE %q (present %v), want %q", text, ok, tt.wantEDE)
				}
			}
			if n := h.up.Count() - before; n != 0 {
				t.Errorf("refused query reached the upstream %d times", n)
			}
		})
	}
	if st := h.srv.Snapshot(); st.Refused == 0 || st.FormErr == 0 {
		t.Errorf("stats refused=%d formerr=%d, want both counted", st.Refused, st.FormErr)
	}
}

// TestReverseLookups: reverse lookups of private and reserved ranges are
// answered locally in every mode, even when the allowlist names them; a
// public one follows the allowlist.
func TestReverseLookups(t *testing.T) {
	for _, passive := range []bool{false, true} {
		mode := "active"
		if passive {
			mode = "passive"
		}
		t.Run(mode, func(t *testing.T) {
			h := start(t, harnessOptions{passive: passive})
			tests := []struct {
				name, qname string
				wantRcode   string
				wantEDE     string
			}{
				{"rfc1918 allowlisted by *.10.in-addr.arpa", "5.0.0.10.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"192.168", "1.1.168.192.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"loopback", "1.0.0.127.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"link-local", "254.169.254.169.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"partial zone cut", "168.192.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"tree apex", "in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"leading zero octet", "01.0.0.10.in-addr.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"ULA", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"mapped v4 private", "1.0.0.0.0.0.a.0.f.f.f.f.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa", "NXDOMAIN", "reason=private_reverse"},
				{"public allowlisted", "14.215.184.93.in-addr.arpa", "NOERROR", ""},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					before := h.up.Count()
					r := h.ask(t, tt.qname, dns.TypePTR)
					if rcode(r) != tt.wantRcode {
						t.Fatalf("PTR %s: rcode %s, want %s", tt.qname, rcode(r), tt.wantRcode)
					}
					_, text, _ := ede(r)
					if text != tt.wantEDE {
						t.Errorf("PTR %s: EDE %q, want %q", tt.qname, text, tt.wantEDE)
					}
					if tt.wantEDE != "" && h.up.Count() != before {
						t.Errorf("PTR %s was forwarded", tt.qname)
					}
				})
			}
		})
	}
}

// TestHealthcheck: answered locally in both modes with an empty allowlist.
func TestHealthcheck(t *testing.T) {
	for _, passive := range []bool{false, true} {
		h := start(t, harnessOptions{passive: passive, allowlist: "# nothing\n"})
		tests := []struct {
			qname string
			qtype uint16
			want  []string
		}{
			{"healthcheck.abox.local", dns.TypeA, []string{"127.0.0.1"}},
			{"HealthCheck.ABOX.local", dns.TypeA, []string{"127.0.0.1"}},
			{"healthcheck.abox.local", dns.TypeAAAA, nil},
			{"healthcheck.abox.local", dns.TypeTXT, nil},
			{"healthcheck.abox.local", dns.TypeHTTPS, nil},
		}
		for _, tt := range tests {
			t.Run(strings.Join([]string{map[bool]string{false: "active", true: "passive"}[passive], tt.qname, dns.TypeToString[tt.qtype]}, " "), func(t *testing.T) {
				r := h.ask(t, tt.qname, tt.qtype)
				if rcode(r) != "NOERROR" || !slices.Equal(addrs(r), tt.want) || len(r.Answer) != len(tt.want) {
					t.Fatalf("rcode %s answer %v, want NOERROR %v", rcode(r), r.Answer, tt.want)
				}
				if h.up.Count() != 0 {
					t.Fatalf("healthcheck reached the upstream")
				}
			})
		}
		if passive {
			for _, e := range h.pol.Profile().Entries {
				if e.Name == "healthcheck.abox.local" {
					t.Errorf("passive profile recorded the healthcheck name")
				}
			}
		}
	}
}

// TestHealthcheckFloodFolded: a guest's flood of healthcheck queries, which
// the filter answers itself, writes the budget of lines per second, not a
// line each (they would rotate the record of what it did resolve).
func TestHealthcheckFloodFolded(t *testing.T) {
	h := start(t, harnessOptions{})
	for range 200 {
		if r := h.ask(t, "healthcheck.abox.local", dns.TypeA); rcode(r) != "NOERROR" {
			t.Fatalf("healthcheck: %s", rcode(r))
		}
	}
	h.ask(t, "example.com", dns.TypeA)
	var health int
	var other bool
	for _, l := range h.logs.lines(t) {
		switch l["name"] {
		case "healthcheck.abox.local":
			health++
		case "example.com":
			other = true
		}
	}
	if health == 0 || health > 4*decisionlog.DefaultLocalPerClient {
		t.Errorf("%d healthcheck lines for 200 queries, want at most a few budgets of %d", health, decisionlog.DefaultLocalPerClient)
	}
	if !other {
		t.Errorf("the query after the flood has no line")
	}
}
