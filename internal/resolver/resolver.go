// Package resolver is a daemon's one resolver: both filters' upstream
// queries go through it, so a name the guest looked up is not looked up
// again when the proxy connects to it. It caches answers for their TTL
// (clamped to the daemon's floor and ceiling), caches negative answers
// (RFC 2308), merges concurrent identical queries into one upstream round
// trip, and bounds its memory. It holds no policy: callers decide names
// before asking and classify the addresses of every answer they use,
// cached or not.
package resolver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"

	"github.com/abox-dev/abox/internal/budget"
	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/upstream"
)

// Defaults for Config fields left zero.
const (
	DefaultMinTTL   = 5 * time.Second
	DefaultMaxTTL   = 300 * time.Second
	DefaultEntries  = 10000
	DefaultMaxBytes = 16 << 20
	DefaultTimeout  = 5 * time.Second
	// DefaultMaxInflight bounds the upstream exchanges in flight: the DNS
	// filter's own bound (256) plus as many for the proxy's lookups.
	DefaultMaxInflight = 512
)

// Config configures a Resolver.
type Config struct {
	// Upstream answers cache misses; required.
	Upstream upstream.Exchanger
	// MinTTL and MaxTTL bound how long an answer (positive or negative) is
	// kept, and the TTLs it is served with.
	MinTTL, MaxTTL time.Duration
	// Entries and MaxBytes bound the cache (answers, and their wire size);
	// a negative Entries disables caching (queries are still merged).
	Entries  int
	MaxBytes int
	// Timeout bounds one upstream exchange shared by merged callers.
	Timeout time.Duration
	// MaxInflight bounds the exchanges with the upstream in flight (0:
	// DefaultMaxInflight); past it a query fails at once (ErrOverloaded)
	// instead of holding a socket and a goroutine for up to Timeout. The
	// proxy's lookups have no other bound than the guest's budget, which
	// over a dead upstream is thousands of exchanges at once.
	MaxInflight int
	// Budget, when set, is charged two queries (A and AAAA, as sent) for
	// every LookupNetIP that must go upstream, on behalf of the guest
	// egress.ClientOf(ctx) names:
	// the same per-client bucket the DNS filter charges for the guest's own
	// queries. Over budget, the lookup fails (temporary, never "no such
	// host"); cached names cost nothing.
	Budget *budget.Limiter
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Panics reports a panic while fetching an answer (nil: not reported).
	// The panic is recovered either way and the callers get an error: a
	// shared fetch runs under singleflight's DoChan, which would re-raise
	// it where nothing can recover it.
	Panics *contain.Reporter
}

// Resolver implements upstream.Exchanger and egress.Resolver. It is safe
// for concurrent use.
type Resolver struct {
	up             upstream.Exchanger
	minTTL, maxTTL uint32 // seconds, 1 <= minTTL <= maxTTL
	timeout        time.Duration
	now            func() time.Time
	budget         *budget.Limiter // nil: lookups are not charged
	inflight       chan struct{}   // a slot per upstream exchange in flight
	panics         *contain.Reporter

	mu       sync.Mutex
	entries  map[key]*entry
	bytes    int
	maxN     int // <= 0: no caching
	maxBytes int

	// addrs caches LookupNetIP results by lowercase FQDN, each until the
	// first of its A and AAAA answers expires; bounded by maxN too.
	addrs map[string]addrEntry

	flight singleflight.Group
	st     struct{ hits, misses, merged, errors, evicted, limited, overloaded atomic.Uint64 }
}

type addrEntry struct {
	addrs   []netip.Addr // nil: the name has no address
	expires time.Time
}

type key struct {
	name          string // lowercase FQDN
	qtype, qclass uint16
	do            bool
}

func (k key) String() string {
	s := k.name + "/" + strconv.Itoa(int(k.qtype)) + "/" + strconv.Itoa(int(k.qclass))
	if k.do {
		s += "/do"
	}
	return s
}

type entry struct {
	msg     *dns.Msg // as stored, TTLs clamped; never handed out
	size    int
	stored  time.Time
	expires time.Time
}

// New returns a resolver over cfg.Upstream.
func New(cfg Config) (*Resolver, error) {
	if cfg.Upstream == nil {
		return nil, errors.New("resolver: no upstream")
	}
	lo, hi := cfg.MinTTL, cfg.MaxTTL
	if lo <= 0 {
		lo = DefaultMinTTL
	}
	if hi <= 0 {
		hi = DefaultMaxTTL
	}
	if lo < time.Second || hi < lo {
		return nil, errors.New("resolver: want 1s <= TTL floor <= TTL ceiling")
	}
	r := &Resolver{
		up: cfg.Upstream, minTTL: uint32(lo / time.Second), maxTTL: uint32(hi / time.Second),
		timeout: cfg.Timeout, now: cfg.Now, budget: cfg.Budget, panics: cfg.Panics,
		entries: map[key]*entry{}, maxN: cfg.Entries, maxBytes: cfg.MaxBytes,
		addrs: map[string]addrEntry{},
	}
	if r.timeout <= 0 {
		r.timeout = DefaultTimeout
	}
	n := cfg.MaxInflight
	if n <= 0 {
		n = DefaultMaxInflight
	}
	r.inflight = make(chan struct{}, n)
	if r.now == nil {
		r.now = time.Now
	}
	if r.maxN == 0 {
		r.maxN = DefaultEntries
	}
	if r.maxBytes <= 0 {
		r.maxBytes = DefaultMaxBytes
	}
	return r, nil
}

// Stats are the resolver's counters.
type Stats struct {
	Hits    uint64 `json:"hits"`
	Misses  uint64 `json:"misses"`
	Merged  uint64 `json:"merged"`
	Errors  uint64 `json:"errors"`
	Evicted uint64 `json:"evicted"`
	// Limited counts lookups refused because the guest was over budget.
	Limited uint64 `json:"limited"`
	// Overloaded counts queries refused at MaxInflight.
	Overloaded uint64 `json:"overloaded"`
	Entries    int    `json:"entries"`
	Bytes      int    `json:"bytes"`
}

// Stats returns the counters.
func (r *Resolver) Stats() Stats {
	r.mu.Lock()
	n, b := len(r.entries), r.bytes
	r.mu.Unlock()
	return Stats{Hits: r.st.hits.Load(), Misses: r.st.misses.Load(), Merged: r.st.merged.Load(),
		Errors: r.st.errors.Load(), Evicted: r.st.evicted.Load(), Limited: r.st.limited.Load(), Overloaded: r.st.overloaded.Load(), Entries: n, Bytes: b}
}

// lookupQueries is what a LookupNetIP sends upstream: A and AAAA.
const lookupQueries = 2

// LookupNetIP resolves host (A and AAAA) through the cache. The addresses
// are not filtered: the caller classifies them on every use. A repeated
// lookup of a cached name costs a map read: the address list is kept until
// the first of its two answers expires.
func (r *Resolver) LookupNetIP(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	name := strings.ToLower(dns.Fqdn(host))
	now := r.now()
	if r.maxN > 0 {
		r.mu.Lock()
		e, ok := r.addrs[name]
		r.mu.Unlock()
		if ok && now.Before(e.expires) {
			r.st.hits.Add(1)
			if e.addrs == nil {
				return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
			}
			return slices.Clone(e.addrs), nil
		}
	}
	if client, ok := egress.ClientOf(ctx); ok && r.budget != nil {
		if ok, _ := r.budget.AllowN(client, now, lookupQueries); !ok {
			r.st.limited.Add(1)
			return nil, &net.DNSError{Err: "lookup budget of " + client.String() + " exceeded", Name: host, IsTemporary: true}
		}
	}
	addrs, err := upstream.LookupNetIP(ctx, r, host, upstream.DefaultUDPSize)
	var de *net.DNSError
	if r.maxN > 0 && (err == nil || (errors.As(err, &de) && de.IsNotFound)) {
		r.putAddrs(name, addrs)
	}
	return addrs, err
}

// putAddrs remembers a lookup's result for as long as both its answers
// stay cached; a lookup whose answers were not cached is not remembered.
func (r *Resolver) putAddrs(name string, addrs []netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var exp time.Time
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		e := r.entries[key{name: name, qtype: t, qclass: dns.ClassINET}]
		if e == nil {
			return
		}
		if exp.IsZero() || e.expires.Before(exp) {
			exp = e.expires
		}
	}
	if _, ok := r.addrs[name]; !ok && len(r.addrs) >= r.maxN {
		for k := range r.addrs { // random order: see put
			delete(r.addrs, k)
			if len(r.addrs) < r.maxN {
				break
			}
		}
	}
	r.addrs[name] = addrEntry{addrs: slices.Clone(addrs), expires: exp}
}

// Exchange answers m from the cache or the upstream. The answer is the
// caller's own copy, with m's ID and TTLs counting down since it was
// fetched. A query the cache cannot key (not exactly one question, records
// besides OPT) goes upstream as it is.
func (r *Resolver) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	k, ok := keyOf(m)
	if !ok {
		return r.exchangeUp(ctx, m)
	}
	now := r.now()
	if out := r.get(k, m.Id, now); out != nil {
		r.st.hits.Add(1)
		return out, 0, nil
	}
	type result struct {
		msg *dns.Msg
		rtt time.Duration
	}
	ch := r.flight.DoChan(k.String(), func() (v any, err error) {
		defer func() {
			if p := recover(); p != nil {
				r.panics.Report("upstream query", p, "name", k.name)
				r.st.errors.Add(1)
				v, err = nil, fmt.Errorf("querying upstream for %s: %w", k.name, errPanic)
			}
		}()
		r.st.misses.Add(1)
		// The exchange is shared: one caller giving up must not cancel it
		// for the others.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.timeout)
		defer cancel()
		resp, rtt, err := r.exchangeUp(uctx, m)
		if err != nil {
			r.st.errors.Add(1)
			return nil, err
		}
		r.put(k, resp, r.now())
		return result{resp, rtt}, nil
	})
	select {
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	case res := <-ch:
		if res.Err != nil {
			return nil, 0, res.Err
		}
		if res.Shared {
			r.st.merged.Add(1)
		}
		v := res.Val.(result)
		out := v.msg.Copy()
		out.Id = m.Id
		return out, v.rtt, nil
	}
}

// ErrOverloaded: MaxInflight exchanges with the upstream were in flight.
var ErrOverloaded = errors.New("too many upstream queries in flight")

// exchangeUp sends m to the upstream in one of the MaxInflight slots.
func (r *Resolver) exchangeUp(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	select {
	case r.inflight <- struct{}{}:
	default:
		r.st.overloaded.Add(1)
		return nil, 0, ErrOverloaded
	}
	defer func() { <-r.inflight }()
	return r.up.Exchange(ctx, m)
}

// errPanic is the error of a fetch that panicked (reported to Config.Panics).
var errPanic = errors.New("panic while fetching the answer")

func keyOf(m *dns.Msg) (key, bool) {
	if len(m.Question) != 1 || m.Opcode != dns.OpcodeQuery || len(m.Answer) > 0 || len(m.Ns) > 0 {
		return key{}, false
	}
	var do bool
	for _, rr := range m.Extra {
		opt, ok := rr.(*dns.OPT)
		if !ok {
			return key{}, false
		}
		do = opt.Do()
	}
	q := m.Question[0]
	return key{name: strings.ToLower(dns.Fqdn(q.Name)), qtype: q.Qtype, qclass: q.Qclass, do: do}, true
}

// get returns a copy of the live entry for k with TTLs lowered by its age.
func (r *Resolver) get(k key, id uint16, now time.Time) *dns.Msg {
	if r.maxN < 0 {
		return nil
	}
	r.mu.Lock()
	e := r.entries[k]
	r.mu.Unlock()
	if e == nil || !now.Before(e.expires) {
		return nil
	}
	out := e.msg.Copy()
	out.Id = id
	age := uint32(now.Sub(e.stored) / time.Second)
	for _, sec := range [][]dns.RR{out.Answer, out.Ns, out.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			h.Ttl = max(h.Ttl-min(age, h.Ttl), 1)
		}
	}
	return out
}

// put stores resp for its TTL: the smallest TTL of its records for an
// answer, the SOA's negative TTL for NXDOMAIN and NODATA (RFC 2308), the
// floor when there is none; clamped to [minTTL, maxTTL]. Failures and
// truncated answers are not stored.
func (r *Resolver) put(k key, resp *dns.Msg, now time.Time) {
	if r.maxN < 0 || resp.Truncated || (resp.Rcode != dns.RcodeSuccess && resp.Rcode != dns.RcodeNameError) {
		return
	}
	ttl := r.ttlOf(resp)
	msg := resp.Copy()
	for _, sec := range [][]dns.RR{msg.Answer, msg.Ns, msg.Extra} {
		for _, rr := range sec {
			if h := rr.Header(); h.Rrtype != dns.TypeOPT {
				h.Ttl = min(max(h.Ttl, r.minTTL), r.maxTTL)
			}
		}
	}
	e := &entry{msg: msg, size: msg.Len(), stored: now, expires: now.Add(time.Duration(ttl) * time.Second)}
	if e.size > r.maxBytes/16 {
		return // one answer may not take a large share of the cache
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old := r.entries[k]; old != nil {
		r.bytes -= old.size
		delete(r.entries, k)
	}
	if len(r.entries) >= r.maxN || r.bytes+e.size > r.maxBytes {
		for ok, oe := range r.entries {
			if !now.Before(oe.expires) {
				r.bytes -= oe.size
				delete(r.entries, ok)
				r.st.evicted.Add(1)
			}
		}
		// Go's map order is random, so a guest cannot choose whose
		// entries go.
		for ok, oe := range r.entries {
			if len(r.entries) < r.maxN && r.bytes+e.size <= r.maxBytes {
				break
			}
			r.bytes -= oe.size
			delete(r.entries, ok)
			r.st.evicted.Add(1)
		}
	}
	r.entries[k] = e
	r.bytes += e.size
}

func (r *Resolver) ttlOf(resp *dns.Msg) uint32 {
	ttl := uint32(0)
	set := false
	if resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0 {
		for _, rr := range resp.Answer {
			if !set || rr.Header().Ttl < ttl {
				ttl, set = rr.Header().Ttl, true
			}
		}
	} else {
		for _, rr := range resp.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl, set = min(soa.Hdr.Ttl, soa.Minttl), true
				break
			}
		}
	}
	if !set {
		return r.minTTL
	}
	return min(max(ttl, r.minTTL), r.maxTTL)
}
