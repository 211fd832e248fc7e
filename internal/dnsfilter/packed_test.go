package dnsfilter

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/netclass"
)

func mustRR(t *testing.T, s string) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// upstreamAnswer is what a resolver answered for name/qtype.
func upstreamAnswer(t *testing.T, name string, qtype uint16, rcode int, ad bool, answer, ns, extra []string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name+".", qtype)
	m.Response, m.Rcode, m.AuthenticatedData = true, rcode, ad
	for _, s := range answer {
		m.Answer = append(m.Answer, mustRR(t, s))
	}
	for _, s := range ns {
		m.Ns = append(m.Ns, mustRR(t, s))
	}
	for _, s := range extra {
		m.Extra = append(m.Extra, mustRR(t, s))
	}
	return m
}

// canonical is a message as text with record names lowercased, the question
// kept as sent: the packed and the built answer may compress names against
// differently spelled questions, which is no difference to a client.
func canonical(m *dns.Msg) string {
	var b strings.Builder
	h := m.MsgHdr
	fmt.Fprintf(&b, "id=%d qr=%v op=%d aa=%v tc=%v rd=%v ra=%v z=%v ad=%v cd=%v rcode=%d\n",
		h.Id, h.Response, h.Opcode, h.Authoritative, h.Truncated, h.RecursionDesired, h.RecursionAvailable, h.Zero, h.AuthenticatedData, h.CheckingDisabled, h.Rcode)
	for _, q := range m.Question {
		fmt.Fprintf(&b, "q %s %d %d\n", q.Name, q.Qtype, q.Qclass)
	}
	for i, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			fmt.Fprintf(&b, "%d %s\n", i, strings.ToLower(rr.String()))
		}
	}
	return b.String()
}

// TestPackedReplyIsTheBuiltReply compares, for answers of many shapes and
// queries of every variant (spelling, ID, RD, CD, AD, EDNS with and without
// DO, buffer sizes, age), the packed answer with the one entry.reply
// builds: they must say the same, and the packed one must be used whenever
// the built one needs no truncation.
func TestPackedReplyIsTheBuiltReply(t *testing.T) {
	s := &Server{addrs: netclass.NewPolicy(nil, nil), minTTL: 5, maxTTL: 300}
	t0 := time.Unix(1_700_000_000, 0)
	var long, mid []string
	for i := range 40 {
		mid = append(mid, fmt.Sprintf("mid.example.com. 60 IN A 93.184.215.%d", i+1))
	}
	for i := range 80 {
		long = append(long, fmt.Sprintf("big.example.com. 60 IN A 93.184.%d.%d", i/250, i%250+1))
	}
	cases := []struct {
		name  string
		qtype uint16
		r     *dns.Msg
	}{
		{"example.com", dns.TypeA, upstreamAnswer(t, "example.com", dns.TypeA, 0, false, []string{"example.com. 60 IN A 93.184.215.14"}, nil, nil)},
		{"example.com", dns.TypeAAAA, upstreamAnswer(t, "example.com", dns.TypeAAAA, 0, true, []string{"example.com. 60 IN AAAA 2606:2800:21f:cb07::1", "example.com. 30 IN AAAA 2606:2800:21f:cb07::2"}, nil, nil)},
		{"www.example.com", dns.TypeA, upstreamAnswer(t, "www.example.com", dns.TypeA, 0, false, []string{"WWW.Example.com. 100 IN CNAME cdn.example.net.", "cdn.example.net. 20 IN A 93.184.215.40"}, nil, nil)},
		{"example.com", dns.TypeMX, upstreamAnswer(t, "example.com", dns.TypeMX, 0, false, []string{"example.com. 60 IN MX 10 mail.example.com."}, nil, []string{"mail.example.com. 60 IN A 93.184.215.20"})},
		{"nothing.example.com", dns.TypeA, upstreamAnswer(t, "nothing.example.com", dns.TypeA, dns.RcodeNameError, false, nil, []string{"example.com. 3600 IN SOA ns.example.com. host.example.com. 1 7200 3600 1209600 40"}, nil)},
		{"example.com", dns.TypeTXT, upstreamAnswer(t, "example.com", dns.TypeTXT, 0, false, nil, nil, nil)},
		{"mid.example.com", dns.TypeA, upstreamAnswer(t, "mid.example.com", dns.TypeA, 0, false, mid, nil, nil)},
		{"big.example.com", dns.TypeA, upstreamAnswer(t, "big.example.com", dns.TypeA, 0, false, long, nil, nil)},
	}
	spell := []func(string) string{
		func(n string) string { return n },
		strings.ToUpper,
		func(n string) string { // 0x20: every other letter upper
			b := []byte(n)
			for i := range b {
				if i%2 == 0 && 'a' <= b[i] && b[i] <= 'z' {
					b[i] -= 'a' - 'A'
				}
			}
			return string(b)
		},
	}
	used := 0
	for _, c := range cases {
		e := s.check(c.name, c.qtype, c.r, t0)
		for si, sp := range spell {
			for _, edns := range []uint16{0, 512, 1232, 4096} {
				for _, do := range []bool{false, true} {
					for _, bits := range []int{0, 1, 2, 4, 7} {
						for _, age := range []time.Duration{0, 1500 * time.Millisecond, 25 * time.Second, 10 * time.Minute} {
							req := new(dns.Msg)
							req.SetQuestion(sp(c.name)+".", c.qtype)
							req.Id = uint16(1000 + si*100 + bits)
							req.RecursionDesired, req.CheckingDisabled, req.AuthenticatedData = bits&1 != 0, bits&2 != 0, bits&4 != 0
							if edns > 0 {
								req.SetEdns0(edns, do)
							}
							opt, _ := queryOPT(req)
							now := t0.Add(age)
							built := e.reply(req, opt, now)
							fits := fit(built, maxSize(req, "udp"))
							wire, ok := e.packedReply(make([]byte, 0, 512), req, opt, now, maxSize(req, "udp"))
							where := fmt.Sprintf("%s %s as %q edns=%d do=%v bits=%d age=%s", c.name, dns.TypeToString[c.qtype], req.Question[0].Name, edns, do, bits, age)
							if ok != fits {
								t.Errorf("%s: packed used = %v, built answer fits = %v", where, ok, fits)
								continue
							}
							if !ok {
								continue
							}
							used++
							got := new(dns.Msg)
							if err := got.Unpack(wire); err != nil {
								t.Errorf("%s: packed answer does not parse: %v", where, err)
								continue
							}
							if g, w := canonical(got), canonical(built); g != w {
								t.Errorf("%s:\npacked:\n%s\nbuilt:\n%s", where, g, w)
							}
							if got.Question[0].Name != req.Question[0].Name {
								t.Errorf("%s: question %q, want the spelling asked", where, got.Question[0].Name)
							}
						}
					}
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("the packed answer was never used")
	}
}

// TestPackedReplyRefusesOtherNames: an entry's packed answer is never given
// for a question of another name, even one of the same length.
func TestPackedReplyRefusesOtherNames(t *testing.T) {
	s := &Server{addrs: netclass.NewPolicy(nil, nil), minTTL: 5, maxTTL: 300}
	e := s.check("example.com", dns.TypeA, upstreamAnswer(t, "example.com", dns.TypeA, 0, false, []string{"example.com. 60 IN A 93.184.215.14"}, nil, nil), time.Now())
	for _, n := range []string{"examplf.com.", "example.co.", "example.com.evil.", "xample.com."} {
		req := new(dns.Msg).SetQuestion(n, dns.TypeA)
		if _, ok := e.packedReply(nil, req, nil, time.Now(), 512); ok {
			t.Errorf("question %q answered from the entry of example.com", n)
		}
	}
}

// TestCachedAnswerClassifiedOnEveryUse: the addresses of a cached answer are
// classified each time it is served; an address that became forbidden
// since (the host took it, say) is refused from the warm cache.
func TestCachedAnswerClassifiedOnEveryUse(t *testing.T) {
	s := &Server{addrs: netclass.NewPolicy(nil, nil), minTTL: 5, maxTTL: 300, now: time.Now, pol: nil}
	e := s.check("example.com", dns.TypeA, upstreamAnswer(t, "example.com", dns.TypeA, 0, false, []string{"example.com. 60 IN A 93.184.215.14"}, nil, nil), time.Now())
	req := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	if _, wire, d := s.answer(req, nil, e, "example.com", decision{at: time.Now()}, make([]byte, 0, 512)); wire == nil || d.reason == ReasonRebinding {
		t.Fatalf("public address: packed %v, reason %q; want a packed answer", wire != nil, d.reason)
	}
	s.addrs = netclass.NewPolicy(nil, []netip.Addr{netip.MustParseAddr("93.184.215.14")}) // now a host address
	resp, wire, d := s.answer(req, nil, e, "example.com", decision{at: time.Now()}, make([]byte, 0, 512))
	if wire != nil || resp == nil || resp.Rcode != dns.RcodeNameError || d.reason != ReasonRebinding || d.class != string(netclass.HostAddress) {
		t.Fatalf("address now the host's: packed %v, reason %q class %q; want NXDOMAIN %s, class %s", wire != nil, d.reason, d.class, ReasonRebinding, netclass.HostAddress)
	}
}

// TestBlockedWireIsTheBuiltAnswer: the packed NXDOMAIN of a name the
// policy blocks is byte for byte the answer blocked() builds and packs,
// for every query variant, and is used whenever that answer fits as it is.
func TestBlockedWireIsTheBuiltAnswer(t *testing.T) {
	long := strings.Repeat("*.a-very-long-label-of-a-pattern", 7) + ".test"
	used := 0
	for _, name := range []string{"other.org.", "OTHER.Org.", "x.blocked.test.", strings.Repeat("abcdefghij.", 20) + "test."} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT} {
			for _, dec := range []struct{ reason, rule string }{{"not_allowlisted", ""}, {"special_use", "localhost"}, {"not_allowlisted", long}} {
				for _, edns := range []uint16{0, 512, 1232} {
					for _, do := range []bool{false, true} {
						for _, bits := range []int{0, 1, 2, 3} {
							req := new(dns.Msg)
							req.SetQuestion(name, qtype)
							req.Id = uint16(7 + bits)
							req.RecursionDesired, req.CheckingDisabled = bits&1 != 0, bits&2 != 0
							if edns > 0 {
								req.SetEdns0(edns, do)
							}
							built := blocked(req, allowlist.Decision{Verdict: allowlist.Block, Reason: dec.reason, Rule: dec.rule})
							fits := fit(built, maxSize(req, "udp"))
							want, err := built.Pack()
							if err != nil {
								t.Fatal(err)
							}
							got, ok := blockedWire(make([]byte, 0, 512), req, dec.reason, dec.rule)
							where := fmt.Sprintf("%s %s edns=%d do=%v bits=%d rule=%d bytes", name, dns.TypeToString[qtype], edns, do, bits, len(dec.rule))
							if ok != fits {
								t.Errorf("%s: packed used = %v, built answer fits = %v", where, ok, fits)
								continue
							}
							if ok {
								used++
								if !bytes.Equal(got, want) {
									t.Errorf("%s:\npacked %x\nbuilt  %x", where, got, want)
								}
							}
						}
					}
				}
			}
		}
	}
	if used == 0 {
		t.Fatal("the packed answer was never used")
	}
}

// TestHitLineFieldsEncodedOnce: the decision line of a cache hit, whose
// fields after the client are encoded once per entry and rule, is byte for
// byte the line encoded field by field, also after the rule changes.
func TestHitLineFieldsEncodedOnce(t *testing.T) {
	s := &Server{addrs: netclass.NewPolicy(nil, nil), minTTL: 5, maxTTL: 300}
	e := s.check("a.example.com", dns.TypeAAAA, upstreamAnswer(t, "a.example.com", dns.TypeAAAA, 0, false, []string{"a.example.com. 60 IN AAAA 2606:2800:21f:cb07::1"}, nil, nil), time.Now())
	client := netip.MustParseAddr("10.10.10.2")
	at := time.Unix(1_700_000_000, 123456789)
	line := func(fill func(*decisionlog.Line)) string {
		var buf bytes.Buffer
		w := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{&buf}})
		l := decisionlog.NewLine(at, slog.LevelInfo, "dns").Addr("client", client)
		fill(l)
		w.Emit(l)
		w.Close()
		return buf.String()
	}
	for _, rule := range []string{"*.example.com", "*.example.com", "a.example.com", "*.example.com"} {
		d := decision{name: "a.example.com", qtype: dns.TypeAAAA, verdict: allowlist.Allow, reason: "allowlisted", rule: rule, cached: true, hit: e}
		got := line(func(l *decisionlog.Line) { l.Fields(e.decisionFields(d)) })
		want := line(func(l *decisionlog.Line) { decisionFields(l, d) })
		if got != want {
			t.Errorf("rule %s:\nonce:  %s\nfield: %s", rule, got, want)
		}
	}
}
