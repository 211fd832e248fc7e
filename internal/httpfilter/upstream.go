package httpfilter

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
)

// Limits of the upstream connection pool.
const (
	// upIdleTimeout closes a pooled connection nobody used for this long.
	upIdleTimeout = 90 * time.Second
	// upMaxIdlePerKey and upMaxIdle bound the idle connections kept per
	// key and in all.
	upMaxIdlePerKey = 64
	upMaxIdle       = 512
	// upMaxH2 bounds the shared HTTP/2 connections kept: at the bound a
	// new one takes the place of the one idle longest. Each key (address,
	// host) has its own, kept 90 s after its last stream: without a bound,
	// a guest asking for new names under an allowlisted wildcard (its DNS
	// rate, 200 a second) would have the proxy hold some 18,000
	// connections, their file descriptors (the process's limit) and a GiB
	// of memory. Busy connections are never closed for it: they are
	// bounded by the requests forwarded at once (MaxUpstream).
	upMaxH2 = 256
	// upMaxResponseHeader bounds an upstream response header block.
	upMaxResponseHeader = 1 << 20
	upReadBuf           = 8 << 10
	upWriteBuf          = 4 << 10
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

// upConn is one HTTP/1.1 connection to an origin.
type upConn struct {
	key    upstreamKey
	t      egress.Target // what it was opened for (revocation)
	c      net.Conn      // the connio.IdleConn, or a tls.Conn over it
	raw    *connio.IdleConn
	rb     *connio.ReadBuf // under the tls.Conn (TLS only)
	lim    limitReader     // between br and c: bounds the response header
	br     *bufio.Reader
	bw     *bufio.Writer
	pooled bool           // it can be put back (its key is a real address)
	idleAt time.Time      // when it was put back
	hdr    h1.HeaderClock // ResponseHeaderTimeout of the exchange in flight

	// For alive's peek, set once at dial: the raw socket (nil when it has
	// none), the callback and its result.
	rc       syscall.RawConn
	rcErr    bool
	peekFn   func(fd uintptr) bool
	closeF   func() // u.close as a func value, made once
	peekBuf  [1]byte
	peekDead bool
}

func (u *upConn) close() {
	u.c.Close()
	u.hdr.Stop()
}

// limitReader refuses to read more than n bytes while limited; the header
// phase of a response is limited, its body is not.
type limitReader struct {
	r       io.Reader
	limited bool
	n       int64
	read    int64 // bytes read since the counter was last reset
}

var errResponseHeaderTooLarge = errors.New("reading upstream response: header larger than 1 MiB")

func (l *limitReader) Read(p []byte) (int, error) {
	if l.limited {
		if l.n <= 0 {
			return 0, errResponseHeaderTooLarge
		}
		if int64(len(p)) > l.n {
			p = p[:l.n]
		}
	}
	n, err := l.r.Read(p)
	if l.limited {
		l.n -= int64(n)
	}
	l.read += int64(n)
	return n, err
}

// upstreamPool holds idle HTTP/1.1 connections and shared HTTP/2
// connections to origins, keyed by upstreamKey.
type upstreamPool struct {
	mu    sync.Mutex
	idle  map[upstreamKey][]*upConn
	nidle int
	h2    map[upstreamKey][]*h2Conn
	nh2   int // connections in h2
	maxH2 int // upMaxH2; tests lower it
	// h2Evicted counts HTTP/2 connections closed to make room (upMaxH2).
	h2Evicted atomic.Uint64
}

type h2Conn struct {
	cc *http2.ClientConn
	t  egress.Target
}

func newUpstreamPool() *upstreamPool {
	return &upstreamPool{idle: map[upstreamKey][]*upConn{}, h2: map[upstreamKey][]*h2Conn{}, maxH2: upMaxH2}
}

// get returns an idle HTTP/1.1 connection or a usable HTTP/2 connection to
// one of c's checked addresses for c's host, in the order they were
// checked; nil, nil when there is none.
func (p *upstreamPool) get(c *egress.Checked, useTLS bool) (*upConn, *http2.ClientConn) {
	host := c.Target.Host()
	now := time.Now()
	var stale []*upConn
	p.mu.Lock()
	for _, a := range c.Addrs {
		k := upstreamKey{addr: netip.AddrPortFrom(a, c.Target.Port), host: host, tls: useTLS}
		if hs := p.h2[k]; len(hs) > 0 {
			for _, h := range hs {
				if h2Usable(h.cc) {
					p.mu.Unlock()
					return nil, h.cc
				}
			}
		}
		list := p.idle[k]
		for len(list) > 0 {
			u := list[len(list)-1]
			list = list[:len(list)-1]
			p.nidle--
			if now.Sub(u.idleAt) > upIdleTimeout || !u.alive() {
				stale = append(stale, u)
				continue
			}
			p.idle[k] = list // kept when empty: the next put reuses it (sweep deletes it)
			p.mu.Unlock()
			closeAll(stale)
			return u, nil
		}
		p.setIdle(k, list)
	}
	p.mu.Unlock()
	closeAll(stale)
	return nil, nil
}

func (p *upstreamPool) setIdle(k upstreamKey, list []*upConn) {
	if len(list) == 0 {
		delete(p.idle, k)
		return
	}
	p.idle[k] = list
}

// put gives back a connection whose last exchange ended cleanly.
func (p *upstreamPool) put(u *upConn) {
	if !u.pooled {
		u.close()
		return
	}
	if u.rb != nil {
		u.rb.Idle()
	}
	u.idleAt = time.Now()
	p.mu.Lock()
	if p.nidle >= upMaxIdle || len(p.idle[u.key]) >= upMaxIdlePerKey {
		p.mu.Unlock()
		u.close()
		return
	}
	p.idle[u.key] = append(p.idle[u.key], u)
	p.nidle++
	p.mu.Unlock()
}

// addH2 shares a new HTTP/2 connection under k.
func (p *upstreamPool) addH2(k upstreamKey, t egress.Target, cc *http2.ClientConn) {
	p.mu.Lock()
	var evict *http2.ClientConn
	if p.nh2 >= p.maxH2 {
		evict = p.takeIdlestH2()
	}
	p.h2[k] = append(p.h2[k], &h2Conn{cc: cc, t: t})
	p.nh2++
	p.mu.Unlock()
	if evict != nil {
		p.h2Evicted.Add(1)
		evict.Close()
	}
}

// takeIdlestH2 removes and returns the HTTP/2 connection idle longest, nil
// when every one is busy or has not carried its first stream yet (it was
// dialled for a request about to use it). p.mu must be held.
func (p *upstreamPool) takeIdlestH2() *http2.ClientConn {
	var (
		bestKey  upstreamKey
		bestIdx  = -1
		bestIdle time.Time
	)
	for k, hs := range p.h2 {
		for i, h := range hs {
			st := h.cc.State()
			if st.StreamsActive > 0 || st.LastIdle.IsZero() {
				continue
			}
			if bestIdx < 0 || st.LastIdle.Before(bestIdle) {
				bestKey, bestIdx, bestIdle = k, i, st.LastIdle
			}
		}
	}
	if bestIdx < 0 {
		return nil
	}
	hs := p.h2[bestKey]
	cc := hs[bestIdx].cc
	hs = append(hs[:bestIdx], hs[bestIdx+1:]...)
	if len(hs) == 0 {
		delete(p.h2, bestKey)
	} else {
		p.h2[bestKey] = hs
	}
	p.nh2--
	return cc
}

// sweep closes idle connections that timed out or whose target keep no
// longer passes (a policy change revoked it), and HTTP/2 connections that
// are done or revoked (closing those interrupts their streams).
func (p *upstreamPool) sweep(keep func(egress.Target) bool) {
	now := time.Now()
	var closeH1 []*upConn
	var closeH2 []*http2.ClientConn
	p.mu.Lock()
	for k, list := range p.idle {
		kept := list[:0]
		for _, u := range list {
			if now.Sub(u.idleAt) > upIdleTimeout || !keep(u.t) {
				closeH1 = append(closeH1, u)
				p.nidle--
				continue
			}
			kept = append(kept, u)
		}
		p.setIdle(k, kept)
	}
	for k, hs := range p.h2 {
		kept := hs[:0]
		for _, h := range hs {
			st := h.cc.State()
			if st.Closed || (!h.cc.CanTakeNewRequest() && st.StreamsActive == 0) || !keep(h.t) {
				closeH2 = append(closeH2, h.cc)
				continue
			}
			if st.StreamsActive == 0 && now.Sub(st.LastIdle) > upIdleTimeout && !st.LastIdle.IsZero() {
				closeH2 = append(closeH2, h.cc)
				continue
			}
			kept = append(kept, h)
		}
		p.nh2 -= len(hs) - len(kept)
		if len(kept) == 0 {
			delete(p.h2, k)
		} else {
			p.h2[k] = kept
		}
	}
	p.mu.Unlock()
	closeAll(closeH1)
	for _, cc := range closeH2 {
		cc.Close()
	}
}

// closeIdle closes every pooled connection (shutdown).
func (p *upstreamPool) closeIdle() {
	p.sweep(func(egress.Target) bool { return false })
}

func closeAll(us []*upConn) {
	for _, u := range us {
		u.close()
	}
}

// alive reports whether an idle connection can carry another request: the
// origin has not closed it and sent nothing unasked (on TLS, records may
// wait in the socket: session tickets, which tls.Conn consumes itself). One
// non-blocking peek.
func (u *upConn) alive() bool {
	if u.br.Buffered() > 0 {
		return false // bytes past the last response: they would answer the next request
	}
	if u.rcErr {
		return false
	}
	if u.rc == nil {
		return true
	}
	u.peekDead = false
	u.rc.Read(u.peekFn)
	return !u.peekDead
}

// peek is alive's non-blocking look at the socket.
func (u *upConn) peek(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), u.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN):
	case err != nil || n == 0:
		u.peekDead = true // reset, or closed by the origin
	case !u.key.tls:
		u.peekDead = true // bytes nobody asked for
	}
	return true
}

// setPeek readies alive's peek for u's socket.
func (u *upConn) setPeek() {
	sc, ok := u.raw.Conn.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		u.rcErr = true
		return
	}
	u.rc, u.peekFn = rc, u.peek
}

// dialUpstreamConn opens a connection to one of st's checked addresses:
// TLS for https, offering HTTP/2 and HTTP/1.1. An origin that picks HTTP/2
// gets a shared HTTP/2 connection (h2 set), any other an upConn.
func (p *Proxy) dialUpstreamConn(ctx context.Context, st *fwdState) (*upConn, *http2.ClientConn, error) {
	c, ap, err := p.guard.DialAddr(ctx, st.checked)
	if err != nil {
		return nil, nil, err
	}
	p.stats.upstreamDials.Add(1)
	raw := connio.NewIdleConn(c, p.cfg.IdleTimeout, nil)
	t := st.checked.Target
	useTLS := st.scheme == "https"
	u := &upConn{t: t, raw: raw, c: raw}
	u.closeF = u.close
	u.setPeek()
	// Keyed by the checked address dialled, as get looks it up (with a
	// parent proxy, c's remote address is the parent's).
	u.key = upstreamKey{addr: ap, host: t.Host(), tls: useTLS}
	u.pooled = true
	if useTLS {
		cfg := p.upTLS.Clone()
		cfg.ServerName = t.Host()
		u.rb = connio.NewReadBuf(raw)
		tc := tls.Client(u.rb, cfg)
		hctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			raw.Close()
			return nil, nil, err
		}
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			cc, err := p.h2t.NewClientConn(tc)
			if err != nil {
				tc.Close()
				return nil, nil, err
			}
			if u.pooled {
				p.pool.addH2(u.key, t, cc)
			}
			return nil, cc, nil
		}
		u.c = tc
	}
	u.hdr.Start(raw, p.cfg.ResponseHeaderTimeout)
	u.lim.r = u.c
	u.br = bufio.NewReaderSize(&u.lim, upReadBuf)
	u.bw = bufio.NewWriterSize(u.c, upWriteBuf)
	return u, nil, nil
}
