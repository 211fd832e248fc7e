package dnsfilter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// recorder is an in-process upstream for fuzzing: it records every query
// and answers with a public address, or a private one for names holding
// "private", so that the address check is exercised too.
type recorder struct {
	mu   sync.Mutex
	msgs []*dns.Msg
}

func (r *recorder) Exchange(_ context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	r.mu.Lock()
	r.msgs = append(r.msgs, m.Copy())
	r.mu.Unlock()
	resp := new(dns.Msg)
	resp.SetReply(m)
	q := m.Question[0]
	ip := "93.184.215.14"
	if strings.Contains(q.Name, "private") {
		ip = "10.0.0.1"
	}
	rr, _ := dns.NewRR(q.Name + " 60 IN A " + ip)
	resp.Answer = []dns.RR{rr}
	hint, _ := dns.NewRR(q.Name + " 60 IN HTTPS 1 . ipv4hint=" + ip)
	resp.Extra = []dns.RR{hint}
	return resp, time.Millisecond, nil
}

func (r *recorder) take() []*dns.Msg {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.msgs
	r.msgs = nil
	return out
}

// newFuzzServer returns a server that is never started, for calling
// Handle directly; its decision lines go to log unless log is nil.
func newFuzzServer(f testing.TB, log io.Writer) (*dnsfilter.Server, *recorder, *policy.Engine, *decisionlog.Writer) {
	return newFuzzServerAt(f, log, nil)
}

// newFuzzServerAt is newFuzzServer with the clock now (nil: time.Now).
func newFuzzServerAt(f testing.TB, log io.Writer, now func() time.Time) (*dnsfilter.Server, *recorder, *policy.Engine, *decisionlog.Writer) {
	return newFuzzServerWith(f, log, now, nil)
}

// newFuzzServerWith is newFuzzServerAt with mod, when not nil, applied to
// the server's Config last.
func newFuzzServerWith(f testing.TB, log io.Writer, now func() time.Time, mod func(*dnsfilter.Config)) (*dnsfilter.Server, *recorder, *policy.Engine, *decisionlog.Writer) {
	path := filepath.Join(f.TempDir(), "allowlist.txt")
	if err := os.WriteFile(path, []byte("example.com\n*.example.com\n"), 0o644); err != nil {
		f.Fatal(err)
	}
	pol, err := policy.New(policy.Config{AllowlistPath: path})
	if err != nil {
		f.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { pc.Close() })
	rec := &recorder{}
	var dlog *decisionlog.Writer
	if log != nil {
		// Every query must leave its line: no aggregation of refusals or of
		// local answers (healthcheck floods fold otherwise) here.
		dlog = decisionlog.New(decisionlog.Config{Sinks: []io.Writer{log}, RefusalsPerClient: -1, LocalPerClient: -1})
		f.Cleanup(func() { dlog.Close() })
	}
	cfg := dnsfilter.Config{PacketConn: pc, Policy: pol, Upstream: rec, RateLimit: -1, CacheSize: 100, DecisionLog: dlog, Now: now}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := dnsfilter.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	return srv, rec, pol, dlog
}

func FuzzHandleQuery(f *testing.F) {
	seeds := []*dns.Msg{
		query("example.com", dns.TypeA, 1232),
		query("other.org", dns.TypeAAAA, 0),
		query("private.example.com", dns.TypeA, 4096),
		query("healthcheck.abox.local", dns.TypeA, 0),
		query("1.0.0.10.in-addr.arpa", dns.TypePTR, 0),
		query("example.com", dns.TypeAXFR, 0),
	}
	two := query("example.com", dns.TypeA, 0)
	two.Question = append(two.Question, dns.Question{Name: "evil.test.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	upd := new(dns.Msg).SetUpdate("example.com.")
	seeds = append(seeds, two, upd)
	for _, m := range seeds {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, false)
	}
	logs := &syncBuffer{}
	srv, rec, pol, dlog := newFuzzServer(f, logs)
	client := netip.MustParseAddr("192.0.2.10")
	f.Fuzz(func(t *testing.T, wire []byte, tcp bool) {
		req := new(dns.Msg)
		if err := req.Unpack(wire); err != nil {
			return // the server answers FORMERR before the handler runs
		}
		network := "udp"
		if tcp {
			network = "tcp"
		}
		resp := srv.Handle(context.Background(), client, network, req)
		forwarded := rec.take()
		if req.Response {
			if resp != nil {
				t.Fatalf("answered a response")
			}
			return
		}
		if resp == nil {
			t.Fatalf("no answer to a query")
		}
		// The query names are the guest's: the decision line must still be
		// one valid JSON object naming it.
		dlog.Sync()
		logs.mu.Lock()
		line := logs.b.String()
		logs.b.Reset()
		logs.mu.Unlock()
		var fields map[string]any
		if strings.Count(line, "\n") != 1 || !strings.HasSuffix(line, "\n") || json.Unmarshal([]byte(line), &fields) != nil {
			t.Fatalf("decision log %q is not one JSON line", line)
		}
		if len(req.Question) == 1 && fields["name"] == "" && req.Question[0].Name != "." {
			t.Fatalf("decision line %q lacks the name %q", line, req.Question[0].Name)
		}
		if len(resp.Question) > 1 || (len(resp.Question) == 0 && resp.Rcode != dns.RcodeFormatError) {
			t.Fatalf("response has %d questions with rcode %s", len(resp.Question), dns.RcodeToString[resp.Rcode])
		}
		b, err := resp.Pack()
		if err != nil {
			t.Fatalf("response does not pack: %v", err)
		}
		if !tcp && len(b) > dnsfilter.MaxUDPSize {
			t.Fatalf("UDP response of %d bytes", len(b))
		}
		for _, m := range forwarded {
			if len(m.Question) != 1 || len(m.Answer)+len(m.Ns) != 0 || len(m.Extra) != 1 {
				t.Fatalf("forwarded a message we did not build: %v", m)
			}
			if opt := m.IsEdns0(); opt == nil || len(opt.Option) != 0 {
				t.Fatalf("forwarded client EDNS options: %v", m)
			}
			if d := pol.Decide(m.Question[0].Name); d.Verdict != allowlist.Allow {
				t.Fatalf("forwarded %s, which the policy blocks (%s)", m.Question[0].Name, d.Reason)
			}
		}
		publicAddressesOnly(t, resp)
	})
}

// publicAddressesOnly fails t when resp hands out an A record of an
// address that is not public (the healthcheck's loopback aside).
func publicAddressesOnly(t *testing.T, resp *dns.Msg) {
	t.Helper()
	for _, sec := range [][]dns.RR{resp.Answer, resp.Extra} {
		for _, rr := range sec {
			a, ok := rr.(*dns.A)
			if !ok {
				continue
			}
			ip, _ := netip.AddrFromSlice(a.A)
			if c := netclass.Classify(ip.Unmap()); c != netclass.Public && !strings.EqualFold(a.Hdr.Name, policy.HealthcheckName+".") {
				t.Fatalf("answered %s with %s address %s", a.Hdr.Name, c, ip)
			}
		}
	}
}

// FuzzDatagram feeds raw datagrams to the batched UDP path, twice each so
// that the second is answered from the cache (packed): whatever comes
// back is a response with the query's ID, parses, fits a UDP client,
// echoes a single question as it was asked, and hands out no address the
// guest may not be given.
func FuzzDatagram(f *testing.F) {
	addDatagrams(f, datagramSeeds[:6])
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	f.Add(manyQuestions(12)) // CI's fuzzer found this class: FORMERR echoing every question
	srv, _, _, _ := newFuzzServer(f, nil)
	client := netip.MustParseAddr("192.0.2.10")
	f.Fuzz(func(t *testing.T, wire []byte) {
		for range 2 {
			b := srv.AnswerDatagram(context.Background(), wire, client, make([]byte, 0, dnsfilter.MaxUDPSize))
			if b == nil {
				continue
			}
			resp := new(dns.Msg)
			if err := resp.Unpack(b); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			if !resp.Response || len(wire) < 2 || resp.Id != uint16(wire[0])<<8|uint16(wire[1]) {
				t.Fatalf("answer is not a response to the query's ID: %v", resp.MsgHdr)
			}
			if len(b) > dnsfilter.MaxUDPSize {
				t.Fatalf("UDP answer of %d bytes", len(b))
			}
			req := new(dns.Msg)
			if req.Unpack(wire) == nil && len(req.Question) == 1 && resp.Rcode != dns.RcodeFormatError {
				if len(resp.Question) != 1 || resp.Question[0] != req.Question[0] {
					t.Fatalf("question %v answered as %v", req.Question, resp.Question)
				}
				if req.IsEdns0() == nil && len(b) > dns.MinMsgSize {
					t.Fatalf("answer of %d bytes to a query without EDNS", len(b))
				}
			}
			publicAddressesOnly(t, resp)
		}
	})
}

// datagramSeeds are queries of every kind the datagram fuzzers start from.
var datagramSeeds = []*dns.Msg{
	query("example.com", dns.TypeA, 1232),
	query("ExAmPle.CoM", dns.TypeA, 0),
	query("www.example.com", dns.TypeHTTPS, 512),
	query("private.example.com", dns.TypeA, 4096),
	query("other.org", dns.TypeA, 0),
	query("healthcheck.abox.local", dns.TypeA, 0),
	query("OTHER.org", dns.TypeAAAA, 1232),
	query("1.0.0.10.in-addr.arpa", dns.TypePTR, 0),
	query("example.com", dns.TypeAXFR, 0),
	query("example.com", dns.TypeANY, 1232),
}

// addDatagrams adds each of ms, packed, to f's corpus.
func addDatagrams(f *testing.F, ms []*dns.Msg) {
	for _, m := range ms {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// FuzzQuickParseAnswers: the batched path answers every datagram with the
// same bytes (or the same silence) whether its query was parsed by
// quickParse or by miekg/dns. The clock stands still, so that a cached
// answer's TTLs are the same at both askings; each datagram is first
// answered twice by the miekg/dns path, so that both answers come from the
// same cache state.
func FuzzQuickParseAnswers(f *testing.F) {
	addDatagrams(f, datagramSeeds)
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	srv, _, _, _ := newFuzzServerAt(f, nil, func() time.Time { return at })
	client := netip.MustParseAddr("192.0.2.10")
	f.Fuzz(func(t *testing.T, wire []byte) {
		ctx := context.Background()
		srv.AnswerDatagramUnpacked(ctx, wire, client, nil)
		full := srv.AnswerDatagramUnpacked(ctx, wire, client, make([]byte, 0, dnsfilter.MaxUDPSize))
		quick := srv.AnswerDatagram(ctx, wire, client, make([]byte, 0, dnsfilter.MaxUDPSize))
		if !bytes.Equal(full, quick) {
			t.Fatalf("datagram %x:\nunpacked by miekg/dns, answered %x\nparsed by quickParse, answered %x", wire, full, quick)
		}
	})
}
