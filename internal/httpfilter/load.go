package httpfilter

import (
	"context"
	"net/http"
	"time"

	"github.com/abox-dev/abox/internal/budget"
	"github.com/abox-dev/abox/internal/egress"
)

// Defaults of the proxy's load limits (Config fields left zero).
const (
	// DefaultRequestRate is requests (plain, CONNECT and intercepted) per
	// second per guest address, DefaultRequestBurst its bucket: several
	// times what a package manager issues, far below what one connection
	// can send.
	DefaultRequestRate  = 500
	DefaultRequestBurst = 1000
	// DefaultMaxUpstream bounds the requests forwarded upstream at once,
	// instance-wide: guest connections times HTTP/2 streams would
	// otherwise allow a quarter of a million.
	DefaultMaxUpstream = 512
	// DefaultUpstreamWait is how long a request waits for a free slot
	// before it is answered 503.
	DefaultUpstreamWait = 2 * time.Second
	// budgetClients bounds the guests tracked by the request budget.
	budgetClients = 4096
)

// Reason codes of the load limits.
const (
	ReasonRateLimited  = "rate_limited"
	ReasonUpstreamBusy = "upstream_busy"
)

// limits are the proxy's load limits; the zero value limits nothing.
type limits struct {
	requests *budget.Limiter // nil: no per-guest rate
	upstream chan struct{}   // one token per request forwarded upstream
	wait     time.Duration
}

func newLimits(cfg Config) limits {
	var l limits
	if cfg.RequestRate >= 0 {
		rate, burst := cfg.RequestRate, cfg.RequestBurst
		if rate == 0 {
			rate = DefaultRequestRate
		}
		if burst <= 0 {
			burst = DefaultRequestBurst
		}
		l.requests = budget.New(rate, burst, budgetClients)
	}
	n := cfg.MaxUpstream
	if n <= 0 {
		n = DefaultMaxUpstream
	}
	l.upstream = make(chan struct{}, n)
	l.wait = cfg.UpstreamWait
	if l.wait <= 0 {
		l.wait = DefaultUpstreamWait
	}
	return l
}

// admit charges one request to the guest that sent it (egress.ClientOf,
// set for every guest connection) and reports whether it is within rate.
func (p *Proxy) admit(ctx context.Context) bool {
	if p.limits.requests == nil {
		return true
	}
	c, _ := egress.ClientOf(ctx)
	ok, _ := p.limits.requests.Allow(c, time.Now())
	return ok
}

// refuseRate answers a request over its guest's rate.
func (p *Proxy) refuseRate(w http.ResponseWriter, rec *record, closeConn bool) {
	w.Header().Set("Retry-After", "1")
	p.refuse(w, rec, http.StatusTooManyRequests, ReasonRateLimited, closeConn)
}

// acquireUpstream takes one of the instance's upstream slots, waiting up to
// the configured time; release gives it back.
func (p *Proxy) acquireUpstream(ctx context.Context) bool {
	select {
	case p.limits.upstream <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(p.limits.wait)
	defer t.Stop()
	select {
	case p.limits.upstream <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// releaseUpstream gives back a slot acquireUpstream took.
func (p *Proxy) releaseUpstream() { <-p.limits.upstream }
