package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/upstream"
)

// Resolver looks a name up (A and AAAA) without any filtering; the guard does
// the checking. internal/upstream's client implements it.
type Resolver interface {
	LookupNetIP(ctx context.Context, host string) ([]netip.Addr, error)
}

// Dialer opens TCP connections; *net.Dialer implements it.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Reason codes of the guard. Address refusals use the netclass.Class name
// (for example "loopback", "private", "host_address") as their reason.
const (
	ReasonResolveFailed = "resolve_failed"
	ReasonNoAddress     = "no_address"
)

// Refusal explains why a target may not be reached. Class is set when an
// address was refused; Addr is that address.
type Refusal struct {
	Reason string
	Class  netclass.Class
	Addr   netip.Addr
	// Err is the underlying resolver error for ReasonResolveFailed; it is
	// for logs only and never shown to the guest.
	Err error
}

func (r *Refusal) Error() string {
	if r.Addr.IsValid() {
		return fmt.Sprintf("destination %s refused: %s", r.Addr, r.Reason)
	}
	if r.Err != nil {
		return fmt.Sprintf("destination refused: %s: %v", r.Reason, r.Err)
	}
	return "destination refused: " + r.Reason
}

// Checked is a target whose addresses all passed the policy. It is the only
// thing Dial accepts, so nothing can be dialled that was not checked.
type Checked struct {
	Target Target
	// Addrs are the checked addresses in resolver order; never empty.
	Addrs []netip.Addr
}

// Guard resolves, classifies and dials. It is safe for concurrent use.
type Guard struct {
	// Resolver is used once per Check of a name; required for names.
	Resolver Resolver
	// Policy classifies addresses; nil permits only public addresses and
	// knows no host addresses, so daemons always set it.
	Policy *netclass.Policy
	// Dialer defaults to a net.Dialer with DialTimeout.
	Dialer Dialer
	// DialTimeout bounds each connection attempt; 0 means 10s.
	DialTimeout time.Duration
}

// Check resolves t once (names only) and classifies every address. A name
// that resolves to any refused address is refused as a whole: a mix of
// public and private answers is a rebinding attempt, not a CDN.
func (g *Guard) Check(ctx context.Context, t Target) (*Checked, *Refusal) {
	if t.IsIP() {
		if c := g.Policy.Check(t.Addr); !netclass.Allowed(c) {
			return nil, &Refusal{Reason: string(c), Class: c, Addr: t.Addr}
		}
		return &Checked{Target: t, Addrs: []netip.Addr{t.Addr}}, nil
	}
	if g.Resolver == nil {
		return nil, &Refusal{Reason: ReasonResolveFailed, Err: errors.New("no resolver configured")}
	}
	addrs, err := g.Resolver.LookupNetIP(ctx, t.Name)
	if err != nil {
		var alias *upstream.AliasError
		if errors.As(err, &alias) {
			return nil, &Refusal{Reason: allowlist.ReasonSpecialUseAlias, Err: err}
		}
		return nil, &Refusal{Reason: ReasonResolveFailed, Err: err}
	}
	if len(addrs) == 0 {
		return nil, &Refusal{Reason: ReasonNoAddress}
	}
	for _, a := range addrs {
		if c := g.Policy.Check(a); !netclass.Allowed(c) {
			return nil, &Refusal{Reason: string(c), Class: c, Addr: a}
		}
	}
	// One allocation for the usual answer (an A and an AAAA record).
	cs := &struct {
		Checked
		inline [2]netip.Addr
	}{Checked: Checked{Target: t}}
	out := cs.inline[:0]
	if len(addrs) > len(cs.inline) {
		out = make([]netip.Addr, 0, len(addrs))
	}
	for _, a := range addrs {
		out = append(out, a.WithZone("").Unmap())
	}
	cs.Addrs = out
	return &cs.Checked, nil
}

// Recheck classifies the addresses of an earlier Check again without a
// lookup: what a CONNECT tunnel checked serves the requests inside it for
// the tunnel's life, but never past an address policy that now refuses one
// of them.
func (g *Guard) Recheck(c *Checked) (*Checked, *Refusal) {
	for _, a := range c.Addrs {
		if cl := g.Policy.Check(a); !netclass.Allowed(cl) {
			return nil, &Refusal{Reason: string(cl), Class: cl, Addr: a}
		}
	}
	return c, nil
}

// Dial connects to the first checked address that answers. It never
// resolves anything.
func (g *Guard) Dial(ctx context.Context, c *Checked) (net.Conn, error) {
	conn, _, err := g.DialAddr(ctx, c)
	return conn, err
}

// DialAddr is Dial that also returns which checked address it reached.
// That is the connection's identity for reuse: with a parent proxy the
// socket's remote address is the parent's, the same for every target.
func (g *Guard) DialAddr(ctx context.Context, c *Checked) (net.Conn, netip.AddrPort, error) {
	if c == nil || len(c.Addrs) == 0 {
		return nil, netip.AddrPort{}, errors.New("dialing: no checked address")
	}
	d := g.Dialer
	timeout := g.DialTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if d == nil {
		d = &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	}
	var errs []error
	for _, a := range c.Addrs {
		actx, cancel := context.WithTimeout(ctx, timeout)
		conn, err := d.DialContext(actx, "tcp", net.JoinHostPort(a.String(), strconv.Itoa(int(c.Target.Port))))
		cancel()
		if err == nil {
			return conn, netip.AddrPortFrom(a.Unmap(), c.Target.Port), nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, netip.AddrPort{}, fmt.Errorf("dialing %s: %w", c.Target.Authority(), errors.Join(errs...))
}

type clientKey struct{}

// WithClient records in ctx the guest address a request is made for, so
// that what the request costs (a name lookup) is charged to that guest.
func WithClient(ctx context.Context, client netip.Addr) context.Context {
	return context.WithValue(ctx, clientKey{}, client.Unmap())
}

// ClientOf returns the guest address recorded by WithClient.
func ClientOf(ctx context.Context) (netip.Addr, bool) {
	a, ok := ctx.Value(clientKey{}).(netip.Addr)
	return a, ok && a.IsValid()
}
