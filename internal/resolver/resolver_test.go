package resolver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/budget"
	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/resolver"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func setup(t *testing.T, f *fakedns.Server) (*resolver.Resolver, *clock) {
	t.Helper()
	// The fake upstream is never dead: the timeout only bounds a hang (at
	// 1 s a loaded machine's slow answer failed the test).
	up, err := upstream.New(upstream.Config{Servers: []string{f.Addr}, Timeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	r, err := resolver.New(resolver.Config{Upstream: up, MinTTL: 5 * time.Second, MaxTTL: 300 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return r, clk
}

func ask(t *testing.T, r *resolver.Resolver, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion(name, qtype)
	m.SetEdns0(1232, false)
	resp, _, err := r.Exchange(context.Background(), m)
	if err != nil {
		t.Fatalf("Exchange(%s): %v", name, err)
	}
	if resp.Id != m.Id {
		t.Fatalf("answer ID %d, query ID %d", resp.Id, m.Id)
	}
	return resp
}

// An answer is kept for its TTL, but never less than the floor nor more
// than the ceiling, and is served with its TTL counting down.
func TestTTLFloorAndCeiling(t *testing.T) {
	f := fakedns.StartT(t).Add(
		"short.test. 1 IN A 93.184.215.1",
		"long.test. 86400 IN A 93.184.215.2",
		"mid.test. 60 IN A 93.184.215.3",
	)
	r, clk := setup(t, f)
	tests := []struct {
		name       string
		hitUntil   time.Duration // still cached at this age
		missAt     time.Duration // fetched again at this age
		servedTTL0 uint32        // TTL served right after the fetch
	}{
		{name: "short.test.", hitUntil: 4 * time.Second, missAt: 6 * time.Second, servedTTL0: 5},
		{name: "long.test.", hitUntil: 299 * time.Second, missAt: 301 * time.Second, servedTTL0: 300},
		{name: "mid.test.", hitUntil: 59 * time.Second, missAt: 61 * time.Second, servedTTL0: 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := clk.Now()
			ask(t, r, tt.name, dns.TypeA)
			before := f.CountFor(tt.name)
			if got := ask(t, r, tt.name, dns.TypeA).Answer[0].Header().Ttl; got != tt.servedTTL0 {
				t.Errorf("served TTL %d, want %d", got, tt.servedTTL0)
			}
			clk.Add(tt.hitUntil)
			resp := ask(t, r, tt.name, dns.TypeA)
			if got := f.CountFor(tt.name); got != before {
				t.Errorf("at age %s the upstream was asked again (%d queries, want %d)", tt.hitUntil, got, before)
			}
			if got, want := resp.Answer[0].Header().Ttl, tt.servedTTL0-uint32(tt.hitUntil/time.Second); got != want {
				t.Errorf("at age %s served TTL %d, want %d", tt.hitUntil, got, want)
			}
			clk.t = start.Add(tt.missAt)
			ask(t, r, tt.name, dns.TypeA)
			if got := f.CountFor(tt.name); got != before+1 {
				t.Errorf("at age %s: %d upstream queries, want %d (expired)", tt.missAt, got, before+1)
			}
		})
	}
}

// NXDOMAIN is cached for the SOA's negative TTL (clamped), and without an
// SOA for the floor only; failures are never cached.
func TestNegativeCaching(t *testing.T) {
	f := fakedns.StartT(t)
	f.Handle("gone.test", func(req *dns.Msg) *dns.Msg {
		m := new(dns.Msg).SetRcode(req, dns.RcodeNameError)
		soa, _ := dns.NewRR("test. 3600 IN SOA ns.test. admin.test. 1 7200 900 1209600 60")
		m.Ns = []dns.RR{soa}
		return m
	})
	f.Handle("nosoa.test", func(req *dns.Msg) *dns.Msg { return new(dns.Msg).SetRcode(req, dns.RcodeNameError) })
	f.SetRcode("broken.test", dns.RcodeServerFailure)
	r, clk := setup(t, f)

	ask(t, r, "gone.test.", dns.TypeA)
	clk.Add(59 * time.Second)
	if got := ask(t, r, "gone.test.", dns.TypeA); got.Rcode != dns.RcodeNameError || f.CountFor("gone.test") != 1 {
		t.Errorf("NXDOMAIN within its negative TTL: rcode %s, %d upstream queries; want NXDOMAIN from cache", dns.RcodeToString[got.Rcode], f.CountFor("gone.test"))
	}
	clk.Add(2 * time.Second)
	ask(t, r, "gone.test.", dns.TypeA)
	if f.CountFor("gone.test") != 2 {
		t.Errorf("NXDOMAIN past its negative TTL was not fetched again")
	}

	ask(t, r, "nosoa.test.", dns.TypeA)
	clk.Add(6 * time.Second)
	ask(t, r, "nosoa.test.", dns.TypeA)
	if f.CountFor("nosoa.test") != 2 {
		t.Errorf("NXDOMAIN without SOA was kept past the floor")
	}

	for range 2 {
		if got := ask(t, r, "broken.test.", dns.TypeA); got.Rcode != dns.RcodeServerFailure {
			t.Fatalf("rcode %s, want SERVFAIL passed on", dns.RcodeToString[got.Rcode])
		}
	}
	if f.CountFor("broken.test") != 2 {
		t.Errorf("SERVFAIL was cached: %d upstream queries for two asks", f.CountFor("broken.test"))
	}
}

// Concurrent lookups of one name cost one upstream query.
func TestConcurrentLookupsMerge(t *testing.T) {
	f := fakedns.StartT(t).Add("busy.test. 60 IN A 93.184.215.4").SetDelay("busy.test", 100*time.Millisecond)
	r, _ := setup(t, f)
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 50 {
		wg.Go(func() {
			m := new(dns.Msg).SetQuestion("busy.test.", dns.TypeA)
			if resp, _, err := r.Exchange(context.Background(), m); err != nil || len(resp.Answer) != 1 || resp.Id != m.Id {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of 50 merged lookups failed", failed.Load())
	}
	if got := f.CountFor("busy.test"); got != 1 {
		t.Errorf("50 concurrent lookups cost %d upstream queries, want 1", got)
	}
	if st := r.Stats(); st.Merged+st.Hits < 49 {
		t.Errorf("stats %+v: want 49 merged or cached", st)
	}
}

// A cached answer is only data: the proxy's guard classifies its addresses
// on every use, so a private address is refused the second time too, from
// the cache, and a public one passes.
func TestCachedPrivateAddressStillRefused(t *testing.T) {
	f := fakedns.StartT(t).Add("inside.test. 300 IN A 10.0.0.5", "outside.test. 300 IN A 93.184.215.5")
	r, _ := setup(t, f)
	g := &egress.Guard{Resolver: r, Policy: netclass.New(netclass.Options{})}
	for i := range 2 {
		if _, ref := g.Check(context.Background(), egress.Target{Name: "inside.test", Port: 443}); ref == nil || ref.Class != netclass.Private {
			t.Errorf("check %d of a name with a private address: refusal %v, want class %s", i+1, ref, netclass.Private)
		}
		c, ref := g.Check(context.Background(), egress.Target{Name: "outside.test", Port: 443})
		if ref != nil || len(c.Addrs) != 1 || c.Addrs[0] != netip.MustParseAddr("93.184.215.5") {
			t.Errorf("check %d of a public name: %v, %v", i+1, c, ref)
		}
	}
	if f.CountFor("inside.test") != 2 { // A and AAAA, once each
		t.Errorf("the second check was not served from the cache: %d upstream queries", f.CountFor("inside.test"))
	}
}

// The cache never holds more than its bound, however many names a guest
// asks for.
func TestCacheIsBounded(t *testing.T) {
	f := fakedns.StartT(t)
	for i := range 300 {
		f.Add(fmt.Sprintf("n%d.test. 300 IN A 93.184.1.%d", i, i%250+1))
	}
	up, err := upstream.New(upstream.Config{Servers: []string{f.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := resolver.New(resolver.Config{Upstream: up, Entries: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		ask(t, r, fmt.Sprintf("n%d.test.", i), dns.TypeA)
	}
	if st := r.Stats(); st.Entries > 100 || st.Evicted < 200 {
		t.Errorf("stats %+v: want at most 100 entries and 200 evicted", st)
	}
}

// The address list of a lookup lives no longer than the shorter of its A
// and AAAA answers.
func TestLookupFollowsTheShorterTTL(t *testing.T) {
	f := fakedns.StartT(t).Add("dual.test. 300 IN A 93.184.215.6", "dual.test. 20 IN AAAA 2606:2800::6")
	r, clk := setup(t, f)
	lookup := func() {
		t.Helper()
		if a, err := r.LookupNetIP(context.Background(), "dual.test"); err != nil || len(a) != 2 {
			t.Fatalf("LookupNetIP = %v, %v", a, err)
		}
	}
	lookup()
	clk.Add(19 * time.Second)
	lookup()
	if got := f.CountFor("dual.test"); got != 2 {
		t.Errorf("within both TTLs: %d upstream queries, want 2", got)
	}
	clk.Add(2 * time.Second)
	lookup()
	if got := f.CountFor("dual.test"); got != 3 { // AAAA expired, A still cached
		t.Errorf("past the AAAA TTL: %d upstream queries, want 3", got)
	}
}

// The proxy's lookups are charged to the guest they are made for: over its
// budget a lookup fails (temporarily, never "no such host") and reaches no
// upstream; cached names and other guests are unaffected. The budget counts
// queries as sent: a lookup is two (A and AAAA).
func TestLookupsChargeTheGuestsBudget(t *testing.T) {
	f := fakedns.StartT(t)
	for i := range 10 {
		f.Add(fmt.Sprintf("t%d.tunnel.test. 300 IN A 93.184.1.%d", i, i+1))
	}
	up, err := upstream.New(upstream.Config{Servers: []string{f.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: time.Unix(1_700_000_000, 0)}
	r, err := resolver.New(resolver.Config{Upstream: up, Budget: budget.New(1, 6, 16), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	guest := egress.WithClient(context.Background(), netip.MustParseAddr("10.10.0.2"))
	other := egress.WithClient(context.Background(), netip.MustParseAddr("10.10.1.2"))
	for i := range 3 {
		if _, err := r.LookupNetIP(guest, fmt.Sprintf("t%d.tunnel.test", i)); err != nil {
			t.Fatalf("lookup %d within the budget: %v", i, err)
		}
	}
	before := f.Count()
	if before != 6 {
		t.Errorf("3 lookups within a budget of 6 queries sent %d", before)
	}
	_, err = r.LookupNetIP(guest, "t3.tunnel.test")
	var de *net.DNSError
	if !errors.As(err, &de) || !de.IsTemporary || de.IsNotFound {
		t.Fatalf("lookup over the budget = %v, want a temporary DNSError", err)
	}
	if f.Count() != before {
		t.Errorf("a lookup over the budget reached the upstream")
	}
	if _, err := r.LookupNetIP(guest, "t0.tunnel.test"); err != nil {
		t.Errorf("a cached name cost budget: %v", err)
	}
	if _, err := r.LookupNetIP(other, "t4.tunnel.test"); err != nil {
		t.Errorf("another guest was refused: %v", err)
	}
	clk.Add(2 * time.Second)
	if _, err := r.LookupNetIP(guest, "t5.tunnel.test"); err != nil {
		t.Errorf("after two seconds the budget did not refill: %v", err)
	}
	if st := r.Stats(); st.Limited != 1 {
		t.Errorf("stats %+v: want 1 limited", st)
	}
}

type panickingUpstream struct{ delay time.Duration }

func (p panickingUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	time.Sleep(p.delay) // let the merged callers join
	panic("injected by the test: upstream exchange")
}

// TestFetchPanicIsAnError: a panic while fetching an answer that several
// callers share (singleflight's DoChan re-raises it on a goroutine of its
// own, where nothing can recover it) is reported once and each caller
// gets an error; the resolver and the process go on.
func TestFetchPanicIsAnError(t *testing.T) {
	rep := contain.New(nil)
	r, err := resolver.New(resolver.Config{Upstream: panickingUpstream{50 * time.Millisecond}, Panics: rep})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 5 {
		wg.Go(func() {
			if _, _, err := r.Exchange(context.Background(), new(dns.Msg).SetQuestion("boom.test.", dns.TypeA)); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if failed.Load() != 5 {
		t.Fatalf("%d of 5 callers got an error, want 5", failed.Load())
	}
	if rep.Count() != 1 {
		t.Fatalf("panics reported: %d, want 1 (one shared fetch)", rep.Count())
	}
}

// gateUpstream answers every query once release is closed.
type gateUpstream struct {
	arrived chan struct{}
	release chan struct{}
}

func (g gateUpstream) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	g.arrived <- struct{}{}
	<-g.release
	r := new(dns.Msg).SetReply(m)
	rr, _ := dns.NewRR(m.Question[0].Name + " 60 IN A 93.184.215.14")
	r.Answer = append(r.Answer, rr)
	return r, time.Millisecond, nil
}

// TestInflightIsBounded: with MaxInflight exchanges waiting on a slow
// upstream, further names fail at once (ErrOverloaded, counted) instead of
// each holding a socket and a goroutine for the timeout; the waiting ones
// are answered, and once they are, new names are asked again.
func TestInflightIsBounded(t *testing.T) {
	g := gateUpstream{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	r, err := resolver.New(resolver.Config{Upstream: g, MaxInflight: 4})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(name string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _, err := r.Exchange(ctx, new(dns.Msg).SetQuestion(dns.Fqdn(name), dns.TypeA))
		return err
	}
	var wg sync.WaitGroup
	var failed atomic.Int32
	for i := range 4 {
		wg.Go(func() {
			if ask(fmt.Sprintf("slow%d.test", i)) != nil {
				failed.Add(1)
			}
		})
	}
	for range 4 {
		<-g.arrived // the four slots are taken
	}
	start := time.Now()
	if err := ask("one-more.test"); !errors.Is(err, resolver.ErrOverloaded) {
		t.Fatalf("a fifth name while four wait: %v, want ErrOverloaded", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the refused lookup took %s", d)
	}
	if st := r.Stats(); st.Overloaded == 0 {
		t.Fatalf("stats %+v: no overloaded query counted", st)
	}
	close(g.release)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of the 4 waiting lookups failed", failed.Load())
	}
	if err := ask("later.test"); err != nil {
		t.Fatalf("a lookup once the slots are free: %v", err)
	}
}
