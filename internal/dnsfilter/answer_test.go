package dnsfilter_test

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/dnsfilter"
)

// TestRebinding: an allowlisted name whose answer holds a private or
// reserved address anywhere (answer, CNAME chain end, additional records,
// HTTPS/SVCB hints, translated IPv6 forms) is blocked whole, in both modes.
func TestRebinding(t *testing.T) {
	tests := []struct {
		qname     string
		qtype     uint16
		wantClass string
	}{
		{"internal.example.com", dns.TypeA, "private"},
		{"chain.example.com", dns.TypeA, "private"},
		{"loop.example.com", dns.TypeA, "loopback"},
		{"zero.example.com", dns.TypeA, "unspecified"},
		{"metadata.example.com", dns.TypeA, "metadata"},
		{"cgnat.example.com", dns.TypeA, "cgnat"},
		{"bench.example.com", dns.TypeA, "benchmarking"},
		{"doc.example.com", dns.TypeA, "documentation"},
		{"ula.example.com", dns.TypeAAAA, "unique_local"},
		{"mapped.example.com", dns.TypeAAAA, "private"},
		{"nat64.example.com", dns.TypeAAAA, "private"},
		{"sixtofour.example.com", dns.TypeAAAA, "private"},
		{"hint4.example.com", dns.TypeHTTPS, "private"},
		{"hint6.example.com", dns.TypeHTTPS, "unique_local"},
		{"svcb.example.com", dns.TypeSVCB, "private"},
		{"glue.example.com", dns.TypeMX, "loopback"},
		{"mixed.example.com", dns.TypeA, "private"},
	}
	for _, passive := range []bool{false, true} {
		h := start(t, harnessOptions{passive: passive})
		for _, tt := range tests {
			t.Run(fmt.Sprintf("passive=%v %s %s", passive, tt.qname, dns.TypeToString[tt.qtype]), func(t *testing.T) {
				r := h.ask(t, tt.qname, tt.qtype)
				if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
					t.Fatalf("rcode %s answer %v, want NXDOMAIN and nothing", rcode(r), r.Answer)
				}
				code, text, ok := ede(r)
				if !ok || code != dns.ExtendedErrorCodeBlocked || !strings.HasPrefix(text, "reason=forbidden_address") || strings.Contains(text, "dns_rebinding") || strings.Contains(text, tt.wantClass) {
					// The guest is not told the class, nor that it rebinds.
					t.Errorf("EDE %d %q, want Blocked reason=forbidden_address", code, text)
				}
				// The guest learns the reason code, not which internal
				// range the answer pointed into (that is for the log).
				if strings.Contains(text, "class=") || strings.Contains(text, tt.wantClass) {
					t.Errorf("EDE text %q names the address class %s", text, tt.wantClass)
				}
				if strings.Contains(text, "10.") || strings.Contains(text, "192.168") {
					t.Errorf("EDE text %q leaks the internal address", text)
				}
			})
		}
		if st := h.srv.Snapshot(); st.RebindingBlocked == 0 {
			t.Errorf("rebinding_blocked counter is 0")
		}
		lines := h.logs.lines(t)
		found := false
		for _, l := range lines {
			if l["reason"] == dnsfilter.ReasonRebinding && l["class"] != nil {
				found = true
			}
		}
		if !found {
			t.Errorf("no log line with reason %s and a class", dnsfilter.ReasonRebinding)
		}
	}
}

// TestAllowPrivate: --allow-private lets a named range through and nothing
// else, and never loopback even when it names it; --allow-host does.
func TestAllowPrivate(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts harnessOptions
		loop string
	}{
		{"allow-private", harnessOptions{permit: []string{"10.99.0.0/16", "127.0.0.0/8"}}, "NXDOMAIN"},
		{"allow-host", harnessOptions{permit: []string{"10.99.0.0/16"}, permitHost: []string{"127.0.0.0/8"}}, "NOERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.opts)
			tests := []struct {
				qname     string
				wantRcode string
			}{
				{"permitted.example.com", "NOERROR"},
				{"loop.example.com", tc.loop},
				{"internal.example.com", "NXDOMAIN"},
			}
			for _, tt := range tests {
				if r := h.ask(t, tt.qname, dns.TypeA); rcode(r) != tt.wantRcode {
					t.Errorf("%s: rcode %s, want %s", tt.qname, rcode(r), tt.wantRcode)
				}
			}
		})
	}
}

// TestCNAMEChain: a CDN alias works although its targets are not
// allowlisted, and the answer keeps the whole chain.
func TestCNAMEChain(t *testing.T) {
	h := start(t, harnessOptions{})
	r := h.ask(t, "www.example.com", dns.TypeA)
	if rcode(r) != "NOERROR" {
		t.Fatalf("rcode %s, want NOERROR", rcode(r))
	}
	var got []string
	for _, rr := range r.Answer {
		got = append(got, rr.Header().Name+" "+dns.TypeToString[rr.Header().Rrtype])
	}
	want := []string{"www.example.com. CNAME", "cdn.example.net. CNAME", "edge.cdn.example.org. A"}
	if !slices.Equal(got, want) {
		t.Errorf("answer %v, want %v", got, want)
	}
	// The target on its own is not allowlisted.
	if r := h.ask(t, "cdn.example.net", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Errorf("CNAME target queried directly: rcode %s, want NXDOMAIN", rcode(r))
	}
}

// TestStripping: records that do not belong to the question never reach
// the client: other owners in the answer, other types, NS and junk in
// authority, unrelated additional records, the upstream's OPT options.
func TestStripping(t *testing.T) {
	h := start(t, harnessOptions{})
	h.up.Handle("junk.example.com", func(req *dns.Msg) *dns.Msg {
		m := new(dns.Msg)
		m.SetReply(req)
		for _, s := range []string{
			"junk.example.com. 60 IN A 93.184.215.100",
			"junk.example.com. 60 IN TXT \"not asked\"",
			"unrelated.test. 60 IN A 93.184.215.101",
			"alias.test. 60 IN CNAME junk.example.com.",
		} {
			rr, _ := dns.NewRR(s)
			m.Answer = append(m.Answer, rr)
		}
		ns, _ := dns.NewRR("example.com. 60 IN NS ns.attacker.test.")
		m.Ns = []dns.RR{ns}
		ex, _ := dns.NewRR("ns.attacker.test. 60 IN A 93.184.215.102")
		m.Extra = []dns.RR{ex}
		m.SetEdns0(4096, false)
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6869"})
		return m
	})
	r := h.ask(t, "junk.example.com", dns.TypeA)
	var got []string
	for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range sec {
			got = append(got, rr.Header().Name+" "+dns.TypeToString[rr.Header().Rrtype])
		}
	}
	want := []string{"junk.example.com. A", ". OPT"}
	if !slices.Equal(got, want) {
		t.Errorf("records %v, want %v", got, want)
	}
	if opt := r.IsEdns0(); opt == nil || len(opt.Option) != 0 {
		t.Errorf("OPT %v, want ours without options", opt)
	}
}

// TestTTLClamp: TTLs stay within [5s, 300s].
func TestTTLClamp(t *testing.T) {
	h := start(t, harnessOptions{})
	tests := []struct {
		qname string
		want  uint32
	}{
		{"short.example.com", 5},
		{"long.example.com", 300},
		{"example.com", 60},
	}
	for _, tt := range tests {
		t.Run(tt.qname, func(t *testing.T) {
			r := h.ask(t, tt.qname, dns.TypeA)
			if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != tt.want {
				t.Fatalf("answer %v, want one record with TTL %d", r.Answer, tt.want)
			}
		})
	}
}

// TestSizes: an answer never exceeds what the client advertised, nor 1232
// bytes over UDP; additional records go before TC is set; TCP gets it all.
func TestSizes(t *testing.T) {
	h := start(t, harnessOptions{})
	// many: 60 A records, about 1000 bytes.
	// huge: 120 A records, about 2000 bytes.
	// mx: a small answer with a large additional section.
	for i := range 120 {
		if i < 60 {
			h.up.Add(fmt.Sprintf("many.example.com. 60 IN A 93.184.%d.%d", i/250, i%250+1))
		}
		h.up.Add(fmt.Sprintf("huge.example.com. 60 IN A 93.185.%d.%d", i/250, i%250+1))
	}
	h.up.Add("mx.example.com. 60 IN MX 10 mx1.example.com.", "mx.example.com. 60 IN MX 20 mx2.example.com.")
	var extras []string
	for i := range 40 {
		extras = append(extras, fmt.Sprintf("mx%d.example.com. 60 IN A 93.186.0.%d", i%2+1, i+1))
	}
	h.up.AddExtra("mx.example.com", extras...)

	tests := []struct {
		name      string
		qname     string
		qtype     uint16
		edns      uint16
		network   string
		maxLen    int
		wantTC    bool
		wantAns   int
		wantExtra int // excluding OPT; -1 means don't care
	}{
		{name: "no EDNS, 512", qname: "many.example.com", qtype: dns.TypeA, network: "udp", maxLen: 512, wantTC: true, wantAns: -1, wantExtra: -1},
		{name: "EDNS 512", qname: "many.example.com", qtype: dns.TypeA, edns: 512, network: "udp", maxLen: 512, wantTC: true, wantAns: -1, wantExtra: -1},
		{name: "EDNS 1232 fits", qname: "many.example.com", qtype: dns.TypeA, edns: 1232, network: "udp", maxLen: 1232, wantAns: 60, wantExtra: 0},
		{name: "EDNS 4096 fits", qname: "many.example.com", qtype: dns.TypeA, edns: 4096, network: "udp", maxLen: 1232, wantAns: 60, wantExtra: 0},
		{name: "EDNS 4096 capped at 1232", qname: "huge.example.com", qtype: dns.TypeA, edns: 4096, network: "udp", maxLen: 1232, wantTC: true, wantAns: -1, wantExtra: -1},
		{name: "EDNS 100 means 512", qname: "many.example.com", qtype: dns.TypeA, edns: 100, network: "udp", maxLen: 512, wantTC: true, wantAns: -1, wantExtra: -1},
		{name: "TCP gets everything", qname: "huge.example.com", qtype: dns.TypeA, edns: 4096, network: "tcp", maxLen: 65535, wantAns: 120, wantExtra: 0},
		{name: "additional shed before TC", qname: "mx.example.com", qtype: dns.TypeMX, network: "udp", maxLen: 512, wantAns: 2, wantExtra: 0},
		{name: "additional kept when it fits", qname: "mx.example.com", qtype: dns.TypeMX, edns: 1232, network: "udp", maxLen: 1232, wantAns: 2, wantExtra: 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query(tt.qname, tt.qtype, tt.edns)
			var r *dns.Msg
			if tt.network == "udp" {
				b := h.raw(t, q)
				if len(b) > tt.maxLen {
					t.Errorf("UDP answer is %d bytes, want <= %d", len(b), tt.maxLen)
				}
				r = new(dns.Msg)
				if err := r.Unpack(b); err != nil {
					t.Fatalf("unpacking answer: %v", err)
				}
			} else {
				r = h.exchange(t, q, "tcp")
			}
			if r.Truncated != tt.wantTC {
				t.Errorf("TC=%v, want %v", r.Truncated, tt.wantTC)
			}
			if tt.wantAns >= 0 && len(r.Answer) != tt.wantAns {
				t.Errorf("%d answers, want %d", len(r.Answer), tt.wantAns)
			}
			extra := 0
			for _, rr := range r.Extra {
				if rr.Header().Rrtype != dns.TypeOPT {
					extra++
				}
			}
			if tt.wantExtra >= 0 && extra != tt.wantExtra {
				t.Errorf("%d additional records, want %d", extra, tt.wantExtra)
			}
			if (tt.edns > 0) != (r.IsEdns0() != nil) {
				t.Errorf("OPT present %v, want %v", r.IsEdns0() != nil, tt.edns > 0)
			}
			if opt := r.IsEdns0(); opt != nil && opt.UDPSize() > dnsfilter.MaxUDPSize {
				t.Errorf("advertised UDP size %d, want <= %d", opt.UDPSize(), dnsfilter.MaxUDPSize)
			}
		})
	}
	t.Run("client retries truncated answer over TCP", func(t *testing.T) {
		r := h.exchange(t, query("huge.example.com", dns.TypeA, 1232), "udp")
		if !r.Truncated {
			t.Fatalf("UDP answer not truncated")
		}
		r = h.exchange(t, query("huge.example.com", dns.TypeA, 1232), "tcp")
		if r.Truncated || len(r.Answer) != 120 {
			t.Fatalf("TCP answer TC=%v with %d records, want full 120", r.Truncated, len(r.Answer))
		}
	})
}

// TestTCP: the TCP listener applies the same policy.
func TestTCP(t *testing.T) {
	h := start(t, harnessOptions{})
	tests := []struct {
		qname, want string
	}{
		{"example.com", "NOERROR"},
		{"other.org", "NXDOMAIN"},
		{"internal.example.com", "NXDOMAIN"},
	}
	for _, tt := range tests {
		t.Run(tt.qname, func(t *testing.T) {
			if r := h.exchange(t, query(tt.qname, dns.TypeA, 1232), "tcp"); rcode(r) != tt.want {
				t.Errorf("rcode %s, want %s", rcode(r), tt.want)
			}
		})
	}
}

// TestUpstreamTruncation: a truncated upstream answer is fetched again over TCP.
func TestUpstreamTruncation(t *testing.T) {
	h := start(t, harnessOptions{})
	h.up.SetTruncate(true)
	r := h.ask(t, "example.com", dns.TypeA)
	if rcode(r) != "NOERROR" || !slices.Equal(addrs(r), []string{"93.184.215.14"}) {
		t.Fatalf("rcode %s answer %v, want the address fetched over TCP", rcode(r), r.Answer)
	}
	var nets []string
	for _, q := range h.up.Queries() {
		nets = append(nets, q.Net)
	}
	if !slices.Equal(nets, []string{"udp", "tcp"}) {
		t.Errorf("upstream transports %v, want [udp tcp]", nets)
	}
}

// TestUpstreamSeesOnlyOurQuery: the upstream never sees client EDNS
// options (client subnet, cookies), client flags or stray case: only the
// query the filter built.
func TestUpstreamSeesOnlyOurQuery(t *testing.T) {
	h := start(t, harnessOptions{})
	m := query("ExAmple.COM", dns.TypeA, 4096)
	m.RecursionDesired = false
	m.CheckingDisabled = true
	m.Id = 4242
	opt := m.IsEdns0()
	opt.Option = append(opt.Option,
		&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(10, 1, 2, 0).To4()},
		&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
		&dns.EDNS0_PADDING{Padding: make([]byte, 16)},
	)
	if r := h.exchange(t, m, "udp"); rcode(r) != "NOERROR" {
		t.Fatalf("rcode %s, want NOERROR", rcode(r))
	}
	qs := h.up.Queries()
	if len(qs) != 1 {
		t.Fatalf("upstream got %d queries, want 1", len(qs))
	}
	got := qs[0].Msg
	if got.Id == 4242 {
		t.Errorf("upstream query reuses the client's ID")
	}
	if len(got.Question) != 1 || got.Question[0].Name != "example.com." || got.Question[0].Qtype != dns.TypeA {
		t.Errorf("upstream question %v, want example.com. A", got.Question)
	}
	if !got.RecursionDesired || got.CheckingDisabled {
		t.Errorf("upstream flags RD=%v CD=%v, want RD only", got.RecursionDesired, got.CheckingDisabled)
	}
	if len(got.Answer)+len(got.Ns) != 0 || len(got.Extra) != 1 {
		t.Fatalf("upstream sections answer=%d ns=%d extra=%d, want only our OPT", len(got.Answer), len(got.Ns), len(got.Extra))
	}
	uopt := got.IsEdns0()
	if uopt == nil || len(uopt.Option) != 0 || uopt.UDPSize() != 1232 {
		t.Errorf("upstream OPT %v, want size 1232 and no options", uopt)
	}
}
