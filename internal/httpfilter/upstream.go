package httpfilter

import (
	"context"
	"net/netip"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"github.com/abox-dev/abox/internal/httpfilter/h1client"
)

// upstreamKey names a pooled upstream connection by what was checked: the
// address it is connected to (one of a decision's checked addresses), the
// host it was opened for (for TLS the server name its certificate was
// verified for) and whether it is TLS. A connection is only ever reused for
// a request whose own decision checked that same address for that same
// host, so a name that now resolves elsewhere, or an address that was
// checked for another name, never gets it.
type upstreamKey struct {
	addr netip.AddrPort
	host string
	tls  bool
}

// upstreamPool is the engine's pool keyed by upstreamKey, each connection
// tagged with the target it was opened for: revocation sweeps by target
// (stillAllowed).
type upstreamPool = h1client.Pool[upstreamKey, egress.Target]

func newUpstreamPool() *upstreamPool { return h1client.NewPool[upstreamKey, egress.Target]() }

// pooled returns an idle HTTP/1.1 connection or a usable HTTP/2 connection
// to one of c's checked addresses for c's host, in the order they were
// checked, with the key it was found under; nil, nil when there is none.
func (p *Proxy) pooled(c *egress.Checked, useTLS bool) (*h1client.Conn, *http2.ClientConn, upstreamKey) {
	host := c.Target.Host()
	for _, a := range c.Addrs {
		k := upstreamKey{addr: netip.AddrPortFrom(a, c.Target.Port), host: host, tls: useTLS}
		if u, cc := p.pool.Get(k); u != nil || cc != nil {
			return u, cc, k
		}
	}
	return nil, nil, upstreamKey{}
}

// dialUpstreamConn opens a connection to one of st's checked addresses:
// TLS for https, offering HTTP/2 and HTTP/1.1. An origin that picks HTTP/2
// gets a shared HTTP/2 connection (h2 set), any other a Conn to put back
// under the key returned.
func (p *Proxy) dialUpstreamConn(ctx context.Context, st *fwdState) (*h1client.Conn, *http2.ClientConn, upstreamKey, error) {
	c, ap, err := p.guard.DialAddr(ctx, st.checked)
	if err != nil {
		return nil, nil, upstreamKey{}, err
	}
	p.stats.upstreamDials.Add(1)
	raw := connio.NewIdleConn(c, p.cfg.IdleTimeout, nil)
	t := st.checked.Target
	useTLS := st.scheme == "https"
	// Keyed by the checked address dialled, as pooled looks it up (with a
	// parent proxy, c's remote address is the parent's).
	k := upstreamKey{addr: ap, host: t.Host(), tls: useTLS}
	o := h1client.Options{
		HandshakeTimeout:      p.cfg.HandshakeTimeout,
		ResponseHeaderTimeout: p.cfg.ResponseHeaderTimeout,
		H2:                    p.h2t,
	}
	if useTLS {
		o.TLS = p.upTLS.Clone()
		o.TLS.ServerName = t.Host()
	}
	u, cc, err := h1client.Open(ctx, raw, o)
	if err != nil {
		return nil, nil, upstreamKey{}, err
	}
	if cc != nil {
		p.pool.AddH2(k, t, cc)
	}
	return u, cc, k, nil
}
