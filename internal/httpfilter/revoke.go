package httpfilter

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/policy"
)

// ReasonRevoked: a tunnel, WebSocket or streaming response that was allowed
// when it started, closed because the allowlist or the mode changed.
const ReasonRevoked = "policy_revoked"

// policyPoll is how often the proxy looks for a new allowlist or mode.
const policyPoll = 250 * time.Millisecond

// poolSweepTicks: every this many polls the upstream pool is swept even
// without a policy change.
const poolSweepTicks = 8

// connKey carries the guest's outer connection in a request context.
type connKey struct{}

// liveUse is a guest connection held open for one target: a CONNECT tunnel
// (intercepted or not) or a plain-HTTP exchange that may stream or upgrade.
// Decisions are taken when a request starts; without this, a tunnel opened
// in passive mode or before an entry was removed would outlive the policy
// that allowed it for as long as it kept moving bytes.
type liveUse struct {
	t egress.Target
	// rq, when ruled, is the request the host's rules decided for this use
	// (a plain exchange, or the WebSocket upgrade a tunnel carries): a
	// policy change re-decides it as well as the name. Set before hold,
	// or with setRequest. A value: a use is per request on plain HTTP.
	rq      request
	ruled   bool
	revoked atomic.Bool
	mu      sync.Mutex
	c       net.Conn // nil until attach
}

// setRequest records on a use held already the request its connection now
// carries alone.
func (u *liveUse) setRequest(rq request) {
	u.mu.Lock()
	u.rq, u.ruled = rq, true
	u.mu.Unlock()
}

func (u *liveUse) request() (request, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.rq, u.ruled
}

// attach gives u the connection to close on revocation. It reports false,
// and closes nothing, when u was revoked before: the caller refuses.
func (u *liveUse) attach(c net.Conn) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.revoked.Load() {
		return false
	}
	u.c = c
	return true
}

func (u *liveUse) revoke() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.revoked.Store(true)
	if u.c != nil {
		u.c.Close()
	}
}

type liveSet struct {
	mu sync.Mutex
	m  map[*liveUse]struct{}
}

// hold registers a use of t until unhold is called, then re-applies the
// policy: a decision taken (or a lookup still running) when the policy
// changed may have been missed by the pass that closed everything else, so
// a use the policy in force no longer allows starts revoked. The order
// matters: registered first, any later change finds it.
func (p *Proxy) hold(t egress.Target) *liveUse {
	u := new(liveUse)
	p.holdAs(u, t)
	return u
}

// holdAs is hold with the caller's (zero) liveUse.
func (p *Proxy) holdAs(u *liveUse, t egress.Target) {
	u.t = t
	p.live.mu.Lock()
	if p.live.m == nil {
		p.live.m = map[*liveUse]struct{}{}
	}
	p.live.m[u] = struct{}{}
	p.live.mu.Unlock()
	if !p.useAllowed(u) {
		u.revoke()
	}
}

// unhold ends a use hold registered.
func (p *Proxy) unhold(u *liveUse) {
	p.live.mu.Lock()
	delete(p.live.m, u)
	p.live.mu.Unlock()
}

// stillAllowed re-applies the name part of the decision path to an open
// connection's target. Addresses were checked when it was dialled.
func (p *Proxy) stillAllowed(t egress.Target) bool {
	mode := p.cfg.Policy.Mode()
	if t.IsIP() {
		return mode == policy.Passive // literals are listed nowhere
	}
	return policy.Evaluate(p.cfg.Policy.List(), mode, t.Name).Verdict == allowlist.Allow
}

// useAllowed is stillAllowed for a held use, with its request, if any,
// decided again by the rules in force (as pure as stillAllowed: nothing
// recorded).
func (p *Proxy) useAllowed(u *liveUse) bool {
	if !p.stillAllowed(u.t) {
		return false
	}
	rq, ruled := u.request()
	if !ruled || u.t.IsIP() {
		return true
	}
	l, mode := p.cfg.Policy.List(), p.cfg.Policy.Mode()
	if rq.list == l && rq.mode == mode {
		return true // decided with the policy in force
	}
	rules := l.Rules(policy.Evaluate(l, mode, u.t.Name).Rule)
	d, _ := CheckRequest(rules, mode, rq.method, rq.target)
	return d.Allowed
}

// watchPolicy closes held connections, and pooled upstream connections,
// whose target the policy no longer allows, whenever the allowlist in force
// or the mode changes from list and mode.
func (p *Proxy) watchPolicy(ctx context.Context, list *allowlist.List, mode policy.Mode) {
	tk := time.NewTicker(policyPoll)
	defer tk.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		l, m := p.cfg.Policy.List(), p.cfg.Policy.Mode()
		if l == list && m == mode {
			if tick%poolSweepTicks == 0 {
				// Idle timeouts, and connections put back by a request
				// decided just before a change.
				p.pool.Sweep(p.stillAllowed)
			}
			continue
		}
		list, mode = l, m
		p.revokeStale()
		p.pool.Sweep(p.stillAllowed)
		p.stats.policyChanges.Add(1)
	}
}

func (p *Proxy) revokeStale() {
	p.live.mu.Lock()
	var stale []*liveUse
	for u := range p.live.m {
		if !p.useAllowed(u) {
			stale = append(stale, u)
		}
	}
	p.live.mu.Unlock()
	for _, u := range stale {
		p.log.Info("closing a connection the policy no longer allows", "host", u.t.Host(), "port", int(u.t.Port), "reason", ReasonRevoked)
		u.revoke()
	}
}
