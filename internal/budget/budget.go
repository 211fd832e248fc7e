// Package budget is the per-client query budget of a daemon: a token bucket
// per guest address that the DNS filter charges for every query and the
// shared resolver for every name the proxy looks up for that guest, so a
// guest cannot get around its DNS rate by making the proxy resolve for it.
package budget

import (
	"net/netip"
	"sync"
	"time"
)

// Limiter is a token bucket per client. IPv6 clients are keyed by /64 so a
// guest cannot mint fresh buckets from its own prefix. The map is bounded:
// idle clients are swept, and past the bound new clients share one bucket,
// so a spoofing flood limits itself rather than growing memory.
type Limiter struct {
	mu      sync.Mutex
	rate    float64 // tokens per second, > 0
	burst   float64 // bucket size, >= 1
	max     int     // tracked clients, > 0
	buckets map[netip.Addr]*bucket
	shared  bucket
	swept   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
	// logged is when a refusal for this client was last logged.
	logged time.Time
}

// logEvery spaces out the log lines about one rate-limited client.
const logEvery = 10 * time.Second

// New returns a limiter allowing rate tokens per second per client, with
// burst tokens at most, tracking at most clients clients.
func New(rate float64, burst, clients int) *Limiter {
	return &Limiter{rate: rate, burst: float64(max(burst, 1)), max: clients, buckets: make(map[netip.Addr]*bucket), shared: bucket{tokens: float64(max(burst, 1))}}
}

// Allow takes a token for client and reports whether the query may proceed
// and, when it may not, whether this refusal should be logged.
func (l *Limiter) Allow(client netip.Addr, now time.Time) (ok, logIt bool) {
	return l.AllowN(client, now, 1)
}

// AllowN is Allow for a request that costs n queries: it takes all n
// tokens or none.
func (l *Limiter) AllowN(client netip.Addr, now time.Time, n int) (ok, logIt bool) {
	if client.Is6() {
		p, _ := client.Prefix(64)
		client = p.Addr()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[client]
	if b == nil {
		if len(l.buckets) >= l.max {
			l.sweep(now)
		}
		if len(l.buckets) < l.max {
			b = &bucket{tokens: l.burst, last: now}
			l.buckets[client] = b
		} else {
			b = &l.shared
		}
	}
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(l.burst, b.tokens+d.Seconds()*l.rate)
		b.last = now
	}
	if b.tokens >= float64(n) {
		b.tokens -= float64(n)
		return true, false
	}
	if now.Sub(b.logged) >= logEvery {
		b.logged = now
		return false, true
	}
	return false, false
}

// sweep forgets clients whose bucket has refilled completely (they are
// indistinguishable from new ones), at most once a second.
func (l *Limiter) sweep(now time.Time) {
	if now.Sub(l.swept) < time.Second {
		return
	}
	l.swept = now
	full := time.Duration(l.burst / l.rate * float64(time.Second))
	for a, b := range l.buckets {
		if now.Sub(b.last) >= full {
			delete(l.buckets, a)
		}
	}
}
