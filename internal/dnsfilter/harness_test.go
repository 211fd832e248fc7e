package dnsfilter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

// defaultAllowlist is the list most tests run with. cdn.example.net (the
// CNAME target of www.example.com) is deliberately absent.
const defaultAllowlist = `# test list
example.com
*.example.com
*.wild.test
Other.Example.NET.
bücher.com
14.215.184.93.in-addr.arpa
*.10.in-addr.arpa
`

// zone is the fake upstream's data.
var zone = []string{
	"example.com. 60 IN A 93.184.215.14",
	"example.com. 60 IN AAAA 2606:2800:21f:cb07:6820:80da:af6b:8b2c",
	"example.com. 60 IN TXT \"v=spf1 -all\"",
	"example.com. 60 IN MX 10 mail.example.com.",
	"example.com. 60 IN HTTPS 1 . alpn=h2 ipv4hint=93.184.215.14",
	"example.com. 60 IN PTR host.example.com.",
	"mail.example.com. 60 IN A 93.184.215.20",
	"_sip._tcp.example.com. 60 IN SRV 10 5 5060 sip.example.com.",
	"sip.example.com. 60 IN A 93.184.215.21",
	"a.example.com. 60 IN A 93.184.215.30",
	"a.b.c.example.com. 60 IN A 93.184.215.31",
	"www.example.com. 60 IN CNAME cdn.example.net.",
	"cdn.example.net. 60 IN CNAME edge.cdn.example.org.",
	"edge.cdn.example.org. 60 IN A 93.184.215.40",
	"other.example.net. 60 IN A 93.184.215.50",
	"wild.test. 60 IN A 93.184.215.60",
	"a.wild.test. 60 IN A 93.184.215.61",
	"xn--bcher-kva.com. 60 IN A 93.184.215.70",
	"evil-example.com. 60 IN A 93.184.215.80",
	"example.com.evil.test. 60 IN A 93.184.215.81",
	"other.org. 60 IN A 93.184.215.82",
	"14.215.184.93.in-addr.arpa. 60 IN PTR example.com.",
	// Rebinding attempts.
	"internal.example.com. 60 IN A 10.0.0.5",
	"chain.example.com. 60 IN CNAME hop1.example.net.",
	"hop1.example.net. 60 IN CNAME hop2.example.org.",
	"hop2.example.org. 60 IN A 192.168.1.1",
	"loop.example.com. 60 IN A 127.0.0.1",
	"zero.example.com. 60 IN A 0.0.0.0",
	"metadata.example.com. 60 IN A 169.254.169.254",
	"cgnat.example.com. 60 IN A 100.64.0.1",
	"bench.example.com. 60 IN A 198.18.0.1",
	"doc.example.com. 60 IN A 192.0.2.1",
	"ula.example.com. 60 IN AAAA fd00::1",
	"mapped.example.com. 60 IN AAAA ::ffff:10.0.0.1",
	"nat64.example.com. 60 IN AAAA 64:ff9b::a00:1",
	"sixtofour.example.com. 60 IN AAAA 2002:a00:1::1",
	"hint4.example.com. 60 IN HTTPS 1 . alpn=h2 ipv4hint=10.0.0.1",
	"hint6.example.com. 60 IN HTTPS 1 . alpn=h2 ipv6hint=fd00::1",
	"svcb.example.com. 60 IN SVCB 1 svc.example.net. ipv4hint=192.168.0.1",
	"glue.example.com. 60 IN MX 10 mx.example.net.",
	"mixed.example.com. 60 IN A 93.184.215.90",
	"mixed.example.com. 60 IN A 10.1.2.3",
	"permitted.example.com. 60 IN A 10.99.0.1",
	// TTL clamping.
	"short.example.com. 1 IN A 93.184.215.91",
	"long.example.com. 86400 IN A 93.184.215.92",
}

// extraRecords are additional-section records the fake upstream adds.
var extraRecords = map[string][]string{
	"glue.example.com":      {"mx.example.net. 60 IN A 127.0.0.1"},
	"example.com":           {"mail.example.com. 60 IN A 93.184.215.20"},
	"_sip._tcp.example.com": {"sip.example.com. 60 IN A 93.184.215.21"},
}

type harnessOptions struct {
	allowlist string
	permit    []string
	// permitHost are --allow-host ranges.
	permitHost []string
	passive    bool
	// upstreams replaces the fake upstream's address when set (the fake still runs).
	upstreams []string
	// upstreamTimeout is the filter's wait for an upstream answer;
	// 0 means liveUpstreamTimeout.
	upstreamTimeout time.Duration
	tweak           func(*dnsfilter.Config)
	watch           bool
	// listen is the address to serve on; 127.0.0.1:0 when empty.
	listen string
}

// Every answer through the fake upstream passes the filter's upstream
// timeout, and every answer the filter gives passes the test client's.
// Neither is what a test checks: a fake upstream on loopback is slow only
// on a loaded machine (at 1 s, TestAliasIntoLocalNameRefused got SERVFAIL
// there), so both are bounds for a hang, not for speed. Tests of a dead
// upstream set upstreamTimeout to deadUpstreamTimeout, well inside the
// client's wait.
const (
	liveUpstreamTimeout = 15 * time.Second
	deadUpstreamTimeout = 2 * time.Second
	clientTimeout       = 30 * time.Second
)

type harness struct {
	srv   *dnsfilter.Server
	up    *fakedns.Server
	pol   *policy.Engine
	addr  string
	allow string
	logs  *syncBuffer
	// stop ends Serve (and Watch) and reports what Serve returned; the
	// test's cleanup calls it if the test did not.
	stop func() error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// sync, when set, waits for the lines queued so far to be written.
	sync func()
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines returns the decoded JSON log lines.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	if s.sync != nil {
		s.sync()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q is not JSON: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func newFake(t *testing.T) *fakedns.Server {
	t.Helper()
	f := fakedns.StartT(t).Add(zone...)
	for name, rrs := range extraRecords {
		f.AddExtra(name, rrs...)
	}
	return f
}

func start(t *testing.T, o harnessOptions) *harness {
	t.Helper()
	h := &harness{up: newFake(t), logs: &syncBuffer{}}
	if o.allowlist == "" {
		o.allowlist = defaultAllowlist
	}
	h.allow = filepath.Join(t.TempDir(), "allowlist.txt")
	if err := os.WriteFile(h.allow, []byte(o.allowlist), 0o644); err != nil {
		t.Fatal(err)
	}
	// As in production: decision lines and diagnostics share one
	// asynchronous stream; lines(t) syncs it before reading.
	dlog := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{h.logs}})
	t.Cleanup(func() {
		if err := dlog.Close(); err != nil {
			t.Errorf("closing the decision log: %v", err)
		}
	})
	h.logs.sync = dlog.Sync
	log := slogJSON(dlog)
	pol, err := policy.New(policy.Config{AllowlistPath: h.allow, Logger: log})
	if err != nil {
		t.Fatalf("policy.New: %v", err)
	}
	if o.passive {
		pol.SetMode(policy.Passive)
	}
	h.pol = pol
	servers := o.upstreams
	if servers == nil {
		servers = []string{h.up.Addr}
	}
	timeout := o.upstreamTimeout
	if timeout == 0 {
		timeout = liveUpstreamTimeout
	}
	up, err := upstream.New(upstream.Config{Servers: servers, Timeout: timeout})
	if err != nil {
		t.Fatalf("upstream.New: %v", err)
	}
	var permit []netip.Prefix
	for _, p := range o.permit {
		permit = append(permit, netip.MustParsePrefix(p))
	}
	var permitHost []netip.Prefix
	for _, p := range o.permitHost {
		permitHost = append(permitHost, netip.MustParsePrefix(p))
	}
	if o.listen == "" {
		o.listen = "127.0.0.1:0"
	}
	pc, ln, err := dnsfilter.Listen(o.listen)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	cfg := dnsfilter.Config{
		PacketConn: pc, Listener: ln, Policy: pol, Upstream: up,
		Addrs: netclass.New(netclass.Options{Permit: permit, PermitHost: permitHost}), Logger: log, DecisionLog: dlog,
		RateLimit: -1,
	}
	if o.tweak != nil {
		o.tweak(&cfg)
	}
	h.srv, err = dnsfilter.New(cfg)
	if err != nil {
		t.Fatalf("dnsfilter.New: %v", err)
	}
	h.addr = pc.LocalAddr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- h.srv.Serve(ctx) }()
	n := 1
	if o.watch {
		n = 2
		go func() { done <- pol.Watch(ctx) }()
	}
	if o.watch {
		waitWatching(t, pol, h.allow, o.allowlist)
	}
	var once sync.Once
	var serveErr error
	h.stop = func() error {
		once.Do(func() {
			cancel()
			for range n {
				select {
				case err := <-done:
					if err != nil {
						t.Errorf("Serve/Watch returned %v after cancel, want nil", err)
						serveErr = err
					}
				case <-time.After(6 * time.Second):
					t.Errorf("Serve did not return within 6s of cancel")
					serveErr = errors.New("Serve did not return")
				}
			}
		})
		return serveErr
	}
	t.Cleanup(func() { h.stop() })
	return h
}

// query builds a query with EDNS0 (size 0 means no EDNS).
func query(name string, qtype uint16, ednsSize uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if ednsSize > 0 {
		m.SetEdns0(ednsSize, false)
	}
	return m
}

func (h *harness) exchange(t *testing.T, m *dns.Msg, network string) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: clientTimeout, UDPSize: dns.MaxMsgSize}
	r, _, err := c.Exchange(m, h.addr)
	if err != nil {
		t.Fatalf("exchange %s %s over %s: %v", m.Question[0].Name, dns.TypeToString[m.Question[0].Qtype], network, err)
	}
	return r
}

// ask sends name/qtype over UDP with EDNS0 1232.
func (h *harness) ask(t *testing.T, name string, qtype uint16) *dns.Msg {
	t.Helper()
	return h.exchange(t, query(name, qtype, 1232), "udp")
}

// raw sends m over UDP and returns the undecoded answer, to measure its size.
func (h *harness) raw(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	c, err := net.Dial("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(clientTimeout))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("reading answer: %v", err)
	}
	return buf[:n]
}

// ede returns the text of the response's Extended DNS Error, if any.
func ede(r *dns.Msg) (uint16, string, bool) {
	opt := r.IsEdns0()
	if opt == nil {
		return 0, "", false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			return e.InfoCode, e.ExtraText, true
		}
	}
	return 0, "", false
}

// addrs returns the A/AAAA addresses of an answer section, as strings.
func addrs(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		}
	}
	return out
}

func rcode(r *dns.Msg) string { return dns.RcodeToString[r.Rcode] }

// waitWatching returns once the policy's file watch is live: Watch has no
// readiness signal, so rewrite the file (same content) until a reload shows.
func waitWatching(t *testing.T, pol *policy.Engine, path, content string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for pol.Status().Reloads == 0 {
		if time.Now().After(deadline) {
			t.Fatal("allowlist watch did not start within 10s")
		}
		if err := os.WriteFile(path+".tmp", []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		// Longer than the watch's debounce, or each write would postpone the reload.
		for i := 0; i < 20 && pol.Status().Reloads == 0; i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
}
