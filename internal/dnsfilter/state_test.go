package dnsfilter_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/policy"
)

// clock is a settable time source for the cache and rate limiter.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestCache: a repeated query is answered without the upstream, with aged
// TTLs, until the clamped TTL runs out; the policy is decided before the
// cache, so a removed name stops resolving at once.
func TestCache(t *testing.T) {
	clk := newClock()
	h := start(t, harnessOptions{tweak: func(c *dnsfilter.Config) { c.Now = clk.now }})

	r := h.ask(t, "example.com", dns.TypeA)
	if rcode(r) != "NOERROR" || h.up.CountFor("example.com") != 1 {
		t.Fatalf("first query: rcode %s, upstream queries %d; want NOERROR, 1", rcode(r), h.up.CountFor("example.com"))
	}
	clk.advance(20 * time.Second)
	r = h.ask(t, "EXAMPLE.com", dns.TypeA)
	if got := h.up.CountFor("example.com"); got != 1 {
		t.Errorf("second query reached the upstream (%d queries), want served from cache", got)
	}
	if len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 40 {
		t.Errorf("cached answer %v, want one record with TTL 60-20=40", r.Answer)
	}
	if st := h.srv.Snapshot(); st.CacheHits != 1 {
		t.Errorf("cache_hits %d, want 1", st.CacheHits)
	}
	// Different type, different entry.
	h.ask(t, "example.com", dns.TypeAAAA)
	if got := h.up.CountFor("example.com"); got != 2 {
		t.Errorf("AAAA after A: %d upstream queries, want 2", got)
	}
	clk.advance(41 * time.Second)
	h.ask(t, "example.com", dns.TypeA)
	if got := h.up.CountFor("example.com"); got != 3 {
		t.Errorf("after expiry: %d upstream queries, want 3", got)
	}

	// Negative answers of allowed names are cached too.
	h.ask(t, "nothing.example.com", dns.TypeA)
	h.ask(t, "nothing.example.com", dns.TypeA)
	if got := h.up.CountFor("nothing.example.com"); got != 1 {
		t.Errorf("NXDOMAIN of an allowed name: %d upstream queries, want 1", got)
	}

	// Removing the rule blocks the cached name at once.
	h.ask(t, "a.example.com", dns.TypeA)
	if _, err := h.pol.Remove("*.example.com"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	r = h.ask(t, "a.example.com", dns.TypeA)
	if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
		t.Errorf("after removal: rcode %s answer %v, want NXDOMAIN from a warm cache", rcode(r), r.Answer)
	}
}

// TestCacheBounded: the cache never holds more entries than configured.
func TestCacheBounded(t *testing.T) {
	h := start(t, harnessOptions{tweak: func(c *dnsfilter.Config) { c.CacheSize = 5 }})
	for i := range 20 {
		h.ask(t, fmt.Sprintf("n%d.example.com", i), dns.TypeA)
	}
	if st := h.srv.Snapshot(); st.CacheEntries > 5 {
		t.Errorf("cache holds %d entries, want <= 5", st.CacheEntries)
	}
}

// TestRateLimit: past its burst a client gets REFUSED, counted, each
// refusal with its decision line and one warning, and the refused queries
// cost the upstream nothing; tokens refill with time.
func TestRateLimit(t *testing.T) {
	clk := newClock()
	h := start(t, harnessOptions{tweak: func(c *dnsfilter.Config) {
		c.Now, c.RateLimit, c.RateBurst = clk.now, 2, 5
	}})
	var codes []string
	for range 8 {
		codes = append(codes, rcode(h.ask(t, "other.org", dns.TypeA)))
	}
	want := []string{"NXDOMAIN", "NXDOMAIN", "NXDOMAIN", "NXDOMAIN", "NXDOMAIN", "REFUSED", "REFUSED", "REFUSED"}
	if !slices.Equal(codes, want) {
		t.Fatalf("rcodes %v, want %v", codes, want)
	}
	r := h.ask(t, "example.com", dns.TypeA)
	if rcode(r) != "REFUSED" || h.up.Count() != 0 {
		t.Errorf("allowed name while limited: rcode %s, upstream %d; want REFUSED, 0", rcode(r), h.up.Count())
	}
	if _, text, _ := ede(r); text != "reason=rate_limited" {
		t.Errorf("EDE %q, want reason=rate_limited", text)
	}
	if st := h.srv.Snapshot(); st.RateLimited != 4 {
		t.Errorf("rate_limited %d, want 4", st.RateLimited)
	}
	warned, lines := 0, 0
	for _, l := range h.logs.lines(t) {
		switch {
		case l["reason"] != dnsfilter.ReasonRateLimited:
		case l["msg"] == "dns" && l["verdict"] == "block" && l["rcode"] == "REFUSED":
			lines++
		case l["level"] == "WARN":
			warned++
		}
	}
	if lines != 4 || warned != 1 {
		t.Errorf("%d decision lines and %d warnings about the rate limit, want 4 and 1", lines, warned)
	}
	clk.advance(time.Second) // two tokens
	if r := h.ask(t, "example.com", dns.TypeA); rcode(r) != "NOERROR" {
		t.Errorf("after refill: rcode %s, want NOERROR", rcode(r))
	}
}

// TestFailover: a dead first upstream costs a timeout, not the answer; all
// upstreams dead gives SERVFAIL, counted.
func TestFailover(t *testing.T) {
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	t.Run("first dead", func(t *testing.T) {
		h := start(t, harnessOptions{upstreams: []string{dead.LocalAddr().String()}, upstreamTimeout: deadUpstreamTimeout})
		h2 := start(t, harnessOptions{upstreams: []string{dead.LocalAddr().String(), h.up.Addr}, upstreamTimeout: deadUpstreamTimeout})
		if r := h2.ask(t, "example.com", dns.TypeA); rcode(r) != "NOERROR" || len(r.Answer) != 1 {
			t.Fatalf("rcode %s answer %v, want NOERROR from the second upstream", rcode(r), r.Answer)
		}
	})
	t.Run("all dead", func(t *testing.T) {
		h := start(t, harnessOptions{upstreams: []string{dead.LocalAddr().String()}, upstreamTimeout: deadUpstreamTimeout})
		r := h.ask(t, "example.com", dns.TypeA)
		if rcode(r) != "SERVFAIL" {
			t.Fatalf("rcode %s, want SERVFAIL", rcode(r))
		}
		if _, text, _ := ede(r); text != "reason=upstream_error" {
			t.Errorf("EDE %q, want reason=upstream_error", text)
		}
		if st := h.srv.Snapshot(); st.UpstreamErrors != 1 {
			t.Errorf("upstream_errors %d, want 1", st.UpstreamErrors)
		}
		// A failure is not cached.
		h.ask(t, "example.com", dns.TypeA)
		if st := h.srv.Snapshot(); st.UpstreamQueries != 2 {
			t.Errorf("upstream_queries %d, want 2 (failures are not cached)", st.UpstreamQueries)
		}
	})
}

// TestPassive: passive mode answers names that are not listed, records
// them, and still blocks private answers.
func TestPassive(t *testing.T) {
	h := start(t, harnessOptions{passive: true})
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NOERROR" || len(r.Answer) != 1 {
		t.Fatalf("other.org in passive mode: rcode %s answer %v, want an answer", rcode(r), r.Answer)
	}
	if r := h.ask(t, "internal.example.com", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Errorf("private answer in passive mode: rcode %s, want NXDOMAIN", rcode(r))
	}
	var names []string
	for _, e := range h.pol.Profile().Entries {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, "other.org") {
		t.Errorf("profile %v does not hold other.org", names)
	}
	var reason any
	for _, l := range h.logs.lines(t) {
		if l["name"] == "other.org" {
			reason = l["reason"]
		}
	}
	if reason != policy.ReasonPassive {
		t.Errorf("log reason for other.org %v, want %s", reason, policy.ReasonPassive)
	}
	// Back to active: the recorded name is blocked again, cache or not.
	h.pol.SetMode(policy.Active)
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Errorf("other.org after switching to active: rcode %s, want NXDOMAIN", rcode(r))
	}
}

// TestReload: the allowlist file is watched; an editor's write-and-rename
// applies (soon after the 150 ms debounce), and an invalid file is rejected whole with the
// previous list kept.
func TestReload(t *testing.T) {
	h := start(t, harnessOptions{watch: true, allowlist: "example.com\n"})
	replace := func(content string) {
		t.Helper()
		tmp := filepath.Join(filepath.Dir(h.allow), ".allowlist.txt.swp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, h.allow); err != nil {
			t.Fatal(err)
		}
	}
	waitFor := func(t *testing.T, name, want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second) // the debounce is 150 ms; room for a loaded machine
		for {
			got := rcode(h.ask(t, name, dns.TypeA))
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: rcode %s 10s after the edit, want %s", name, got, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Fatalf("other.org before reload: rcode %s, want NXDOMAIN", rcode(r))
	}
	t.Run("rename applies", func(t *testing.T) {
		replace("example.com\nother.org\n")
		waitFor(t, "other.org", "NOERROR")
	})
	t.Run("invalid file keeps the old list", func(t *testing.T) {
		replace("example.com\nother.org\na.wild.test\n*\n")
		deadline := time.Now().Add(10 * time.Second)
		for h.pol.Status().LastError == "" {
			if time.Now().After(deadline) {
				t.Fatal("reload error not reported within 10s")
			}
			time.Sleep(20 * time.Millisecond)
		}
		if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NOERROR" {
			t.Errorf("other.org after a rejected reload: rcode %s, want NOERROR (old list)", rcode(r))
		}
		if r := h.ask(t, "a.wild.test", dns.TypeA); rcode(r) != "NXDOMAIN" {
			t.Errorf("a.wild.test from the rejected file: rcode %s, want NXDOMAIN", rcode(r))
		}
	})
	t.Run("removal by rename applies", func(t *testing.T) {
		replace("example.com\n")
		waitFor(t, "other.org", "NXDOMAIN")
	})
}

// TestConcurrent hammers the filter from many clients under the race
// detector, checking every answer.
func TestConcurrent(t *testing.T) {
	h := start(t, harnessOptions{})
	cases := []struct {
		name, want string
		qtype      uint16
	}{
		{"example.com", "NOERROR", dns.TypeA},
		{"www.example.com", "NOERROR", dns.TypeA},
		{"other.org", "NXDOMAIN", dns.TypeA},
		{"internal.example.com", "NXDOMAIN", dns.TypeA},
		{"healthcheck.abox.local", "NOERROR", dns.TypeA},
		{"example.com", "NOERROR", dns.TypeAAAA},
		{"1.0.0.10.in-addr.arpa", "NXDOMAIN", dns.TypePTR},
	}
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: []string{"udp", "tcp"}[w%2], Timeout: 3 * time.Second}
			for i := range 100 {
				tc := cases[(w+i)%len(cases)]
				r, _, err := c.Exchange(query(tc.name, tc.qtype, 1232), h.addr)
				if err != nil {
					errs <- fmt.Sprintf("%s: %v", tc.name, err)
					return
				}
				if got := rcode(r); got != tc.want {
					errs <- fmt.Sprintf("%s %s: rcode %s, want %s", tc.name, dns.TypeToString[tc.qtype], got, tc.want)
					return
				}
			}
		}()
	}
	// Reloads and mode flips race the queries.
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for ctx.Err() == nil {
			h.pol.Reload()
			h.srv.Stats()
		}
	}()
	wg.Wait()
	cancel()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if st := h.srv.Snapshot(); st.Queries != 1600 {
		t.Errorf("queries counter %d, want 1600", st.Queries)
	}
}

// TestLogLine: one JSON line per decision with the documented fields.
func TestLogLine(t *testing.T) {
	h := start(t, harnessOptions{})
	h.ask(t, "example.com", dns.TypeA)
	h.ask(t, "other.org", dns.TypeMX)
	lines := h.logs.lines(t)
	var dnsLines []map[string]any
	for _, l := range lines {
		if l["msg"] == "dns" {
			dnsLines = append(dnsLines, l)
		}
	}
	if len(dnsLines) != 2 {
		t.Fatalf("%d decision lines, want 2: %v", len(dnsLines), lines)
	}
	for _, f := range []string{"time", "client", "name", "type", "verdict", "reason", "rule", "upstream_ms", "cached"} {
		if _, ok := dnsLines[0][f]; !ok {
			t.Errorf("decision line lacks %q: %v", f, dnsLines[0])
		}
	}
	want := map[string]any{"client": "127.0.0.1", "name": "other.org", "type": "MX", "verdict": "block", "reason": "not_allowlisted", "cached": false}
	for k, v := range want {
		if dnsLines[1][k] != v {
			t.Errorf("blocked line %s = %v, want %v", k, dnsLines[1][k], v)
		}
	}
	if dnsLines[0]["rule"] != "example.com" || dnsLines[0]["verdict"] != "allow" {
		t.Errorf("allowed line %v, want verdict allow, rule example.com", dnsLines[0])
	}
}

// TestLogComplete: every decision is logged, from concurrent clients, and
// a name chosen to break the line stays one field of one JSON line.
func TestLogComplete(t *testing.T) {
	h := start(t, harnessOptions{})
	const workers, each = 4, 50
	// First, within the client's budget of refusal lines.
	evil := `a"b\\c\000{}.example.com`
	h.ask(t, evil, dns.TypeA)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			c := &dns.Client{Timeout: 3 * time.Second}
			for i := range each {
				name := fmt.Sprintf("host%d-%d.blocked.test", w, i)
				if _, _, err := c.Exchange(query(name, dns.TypeA, 1232), h.addr); err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	n, found := 0, false
	for _, l := range h.logs.lines(t) {
		if l["msg"] != "dns" {
			continue
		}
		n++
		if name, _ := l["name"].(string); strings.Contains(name, "{}.example") {
			found = true
			if l["verdict"] != "block" || l["type"] != "A" || !strings.Contains(name, `"`) {
				t.Errorf("line for the odd name %v, want a block of type A", l)
			}
		}
	}
	// Refusals past the client's budget are counted, not lost: each is in
	// a line or in the aggregate count.
	if sup := h.srv.Snapshot().LogSuppressed; uint64(n)+sup != workers*each+1 {
		t.Errorf("%d decision lines and %d aggregated for %d queries", n, sup, workers*each+1)
	}
	if !found {
		t.Errorf("no decision line names %q", evil)
	}
	if st := h.srv.Snapshot(); st.LogDropped != 0 || st.LogWriteErrors != 0 {
		t.Errorf("log_dropped %d, log_write_errors %d; want 0", st.LogDropped, st.LogWriteErrors)
	}
}

// TestDecisionFollowsEveryListChange: each UDP reader keeps the decisions
// of the names it answers for the list they were made under; a change of
// the allowlist is in force from the next query on, both ways, with the
// answer cached or not, and a switch to passive mode and back decides
// afresh (passive mode records every name it allows).
func TestDecisionFollowsEveryListChange(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "example.com\n"})
	for i := range 3 {
		if r := h.ask(t, "example.com", dns.TypeA); rcode(r) != "NOERROR" {
			t.Fatalf("round %d: example.com listed: rcode %s, want NOERROR", i, rcode(r))
		}
		if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NXDOMAIN" {
			t.Fatalf("round %d: other.org not listed: rcode %s, want NXDOMAIN", i, rcode(r))
		}
		if _, err := h.pol.Remove("example.com"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.pol.Add("other.org"); err != nil {
			t.Fatal(err)
		}
		if r := h.ask(t, "example.com", dns.TypeA); rcode(r) != "NXDOMAIN" {
			t.Errorf("round %d: example.com removed: rcode %s, want NXDOMAIN", i, rcode(r))
		}
		if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NOERROR" {
			t.Errorf("round %d: other.org added: rcode %s, want NOERROR", i, rcode(r))
		}
		if _, err := h.pol.Remove("other.org"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.pol.Add("example.com"); err != nil {
			t.Fatal(err)
		}
	}
	h.pol.SetMode(policy.Passive)
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NOERROR" {
		t.Errorf("other.org (unlisted) in passive mode: rcode %s, want NOERROR", rcode(r))
	}
	h.pol.SetMode(policy.Active)
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Errorf("other.org back in active mode: rcode %s, want NXDOMAIN", rcode(r))
	}
	var names []string
	for _, e := range h.pol.Profile().Entries {
		names = append(names, e.Name)
	}
	if !slices.Contains(names, "other.org") {
		t.Errorf("passive profile %v does not hold other.org", names)
	}
}

// TestUnparsableQueriesHaveLines: a datagram that does not parse, and one
// whose header the server refuses before parsing, are answered FORMERR and
// each has its decision line (before, neither had one).
func TestUnparsableQueriesHaveLines(t *testing.T) {
	h := start(t, harnessOptions{})
	q, _ := query("example.com", dns.TypeA, 0).Pack()
	cut := q[:len(q)-3] // the question cut short
	two := append([]byte(nil), q...)
	two[5] = 2 // QDCOUNT 2
	for _, m := range [][]byte{cut, two} {
		c, err := net.Dial("udp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(m)
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		c.Close()
		r := new(dns.Msg)
		if err != nil || r.Unpack(buf[:n]) != nil || r.Rcode != dns.RcodeFormatError {
			t.Fatalf("answer to %x: %v %v, want FORMERR", m, r, err)
		}
	}
	got := map[string]bool{}
	for _, l := range h.logs.lines(t) {
		if l["msg"] == "dns" && l["verdict"] == "block" && l["rcode"] == "FORMERR" && l["client"] != "" {
			got[l["reason"].(string)] = true
		}
	}
	if !got[dnsfilter.ReasonUnparsable] || !got[dnsfilter.ReasonQuestionCount] {
		t.Errorf("decision lines by reason: %v, want %s and %s", got, dnsfilter.ReasonUnparsable, dnsfilter.ReasonQuestionCount)
	}
}
