package dnsfilter_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/dnsfilter"
)

// panicUpstream panics on every query for a name below "boom.": a stand-in
// for a bug reached by a guest's query, injected below the filter (its
// upstream), so no code of the filter is changed for the test.
type panicUpstream struct{ dnsfilter.Exchanger }

func (p panicUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	if strings.HasPrefix(m.Question[0].Name, "boom.") {
		panic("injected by the test: upstream exchange")
	}
	return p.Exchanger.Exchange(ctx, m)
}

// panicOnce is a slog handler whose first record panics.
type panicOnce struct {
	slog.Handler
	done atomic.Bool
}

func (p *panicOnce) Handle(ctx context.Context, r slog.Record) error {
	if p.done.CompareAndSwap(false, true) {
		panic("injected by the test: log record")
	}
	return p.Handler.Handle(ctx, r)
}

// TestPanicEndsOneQuery: a panic while answering one query ends that query
// only, wherever it happens: on the batched UDP reader (answering at once),
// in the goroutine of a UDP query waiting on the upstream, and in
// miekg/dns's TCP connection goroutine, which recovers nothing itself. The
// filter goes on answering on both transports, counts each panic and logs
// it. Without the recovery the test binary dies.
func TestPanicEndsOneQuery(t *testing.T) {
	logs := &syncBuffer{}
	ph := &panicOnce{Handler: slog.NewJSONHandler(logs, nil)}
	// The rate limiter's clock moves only when the test says: on a loaded
	// machine real time could refill a token between two queries "at once".
	clk := newClock()
	h := start(t, harnessOptions{tweak: func(c *dnsfilter.Config) {
		c.Upstream = panicUpstream{c.Upstream}
		c.Logger = slog.New(ph)
		// One query per half second: the second of two at once is over
		// the rate, and its warning is the first log record.
		c.Now, c.RateLimit, c.RateBurst = clk.now, 2, 1
	}})
	c := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond}
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	answered := func(net string) {
		t.Helper()
		clk.advance(time.Second) // a fresh token
		r := h.exchange(t, query("example.com", dns.TypeA, 1232), net)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			t.Fatalf("after the panic, over %s: %s with %d answers", net, rcode(r), len(r.Answer))
		}
	}
	var want uint64
	check := func(what string) {
		t.Helper()
		want++
		deadline := time.Now().Add(20 * time.Second)
		for h.srv.Snapshot().Panics < want && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := h.srv.Snapshot().Panics; n != want {
			t.Fatalf("%s: panics counted %d, want %d", what, n, want)
		}
		logs.mu.Lock()
		text := logs.b.String()
		logs.mu.Unlock()
		if !strings.Contains(text, `"msg":"panic contained","what":"`+what+`"`) {
			t.Fatalf("%s: no report in the log:\n%s", what, text)
		}
	}

	// The batched reader: the rate-limit warning panics.
	h.ask(t, "example.com", dns.TypeA)
	c.Exchange(query("example.com", dns.TypeA, 1232), h.addr) // no answer: its batch was lost
	check("dns datagram batch")
	answered("udp")
	answered("tcp")

	// A UDP query waiting on the upstream.
	clk.advance(time.Second)
	if r, _, err := c.Exchange(query("boom.example.com", dns.TypeA, 1232), h.addr); err == nil {
		t.Fatalf("a query whose answer panicked was answered %s", rcode(r))
	}
	check("dns query")
	answered("udp")

	// TCP: miekg/dns's connection goroutine.
	clk.advance(time.Second)
	if r, _, err := tcp.Exchange(query("boom.example.com", dns.TypeAAAA, 1232), h.addr); err == nil {
		t.Fatalf("a TCP query whose answer panicked was answered %s", rcode(r))
	}
	check("dns query")
	answered("tcp")
	answered("udp")
}
