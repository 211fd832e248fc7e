package h1client

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

// Pool holds idle HTTP/1.1 connections and shared HTTP/2 connections to
// origins. A connection is found again only under the key it was given, so
// what may share a connection is the caller's choice of K; each one also
// carries the tag it was given, which Sweep shows the caller to decide
// whether it may stay. Safe for concurrent use.
type Pool[K comparable, T any] struct {
	mu    sync.Mutex
	idle  map[K][]idleConn[T]
	nidle int // connections in idle
	h2    map[K][]sharedConn[T]
	nh2   int // connections in h2
	maxH2 int // MaxH2 unless SetMaxH2
	now   func() time.Time
	// h2Evicted counts HTTP/2 connections closed to make room (maxH2).
	h2Evicted atomic.Uint64
}

type idleConn[T any] struct {
	c      *Conn
	tag    T
	idleAt time.Time // when it was put back
}

type sharedConn[T any] struct {
	cc  *http2.ClientConn
	tag T
}

// NewPool returns an empty pool with the package's limits.
func NewPool[K comparable, T any]() *Pool[K, T] {
	return &Pool[K, T]{idle: map[K][]idleConn[T]{}, h2: map[K][]sharedConn[T]{}, maxH2: MaxH2, now: time.Now}
}

// Held counts the connections kept: idle HTTP/1.1 ones and shared HTTP/2
// ones.
func (p *Pool[K, T]) Held() (idle, h2 int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nidle, p.nh2
}

// SetMaxH2 changes the bound on shared HTTP/2 connections (tests).
func (p *Pool[K, T]) SetMaxH2(n int) {
	p.mu.Lock()
	p.maxH2 = n
	p.mu.Unlock()
}

// H2Evicted counts the HTTP/2 connections closed to make room for new ones.
func (p *Pool[K, T]) H2Evicted() uint64 { return p.h2Evicted.Load() }

// H2Usable reports whether cc can carry a new request: CanTakeNewRequest
// also says yes for a connection closed before its first request (so that
// its error is reported).
func H2Usable(cc *http2.ClientConn) bool {
	return cc.CanTakeNewRequest() && !cc.State().Closed
}

// Get returns a usable HTTP/2 connection kept under k, else an idle
// HTTP/1.1 one (the last put back) that is alive and not past IdleTimeout;
// nil, nil when there is none. Those found dead or too old are closed.
func (p *Pool[K, T]) Get(k K) (*Conn, *http2.ClientConn) {
	now := p.now()
	var stale []*Conn
	p.mu.Lock()
	for _, h := range p.h2[k] {
		if H2Usable(h.cc) {
			p.mu.Unlock()
			return nil, h.cc
		}
	}
	list := p.idle[k]
	for len(list) > 0 {
		e := list[len(list)-1]
		list[len(list)-1] = idleConn[T]{}
		list = list[:len(list)-1]
		p.nidle--
		if now.Sub(e.idleAt) > IdleTimeout || !e.c.Alive() {
			stale = append(stale, e.c)
			continue
		}
		p.idle[k] = list // kept when empty: the next put reuses it (Sweep deletes it)
		p.mu.Unlock()
		closeAll(stale)
		return e.c, nil
	}
	p.setIdle(k, list)
	p.mu.Unlock()
	closeAll(stale)
	return nil, nil
}

func (p *Pool[K, T]) setIdle(k K, list []idleConn[T]) {
	if len(list) == 0 {
		delete(p.idle, k)
		return
	}
	p.idle[k] = list
}

// Put gives back, under k and tagged tag, a connection whose last exchange
// ended cleanly; past MaxIdlePerKey or MaxIdle it is closed instead.
func (p *Pool[K, T]) Put(k K, tag T, u *Conn) {
	if u.RB != nil {
		u.RB.Idle()
	}
	now := p.now()
	p.mu.Lock()
	if p.nidle >= MaxIdle || len(p.idle[k]) >= MaxIdlePerKey {
		p.mu.Unlock()
		u.Close()
		return
	}
	p.idle[k] = append(p.idle[k], idleConn[T]{c: u, tag: tag, idleAt: now})
	p.nidle++
	p.mu.Unlock()
}

// AddH2 shares a new HTTP/2 connection under k, tagged tag. At the bound
// the one idle longest is closed to make room.
func (p *Pool[K, T]) AddH2(k K, tag T, cc *http2.ClientConn) {
	p.mu.Lock()
	var evict *http2.ClientConn
	if p.nh2 >= p.maxH2 {
		evict = p.takeIdlestH2()
	}
	p.h2[k] = append(p.h2[k], sharedConn[T]{cc: cc, tag: tag})
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
func (p *Pool[K, T]) takeIdlestH2() *http2.ClientConn {
	var (
		bestKey  K
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

// Sweep closes idle connections that timed out or whose tag keep refuses
// (a policy change revoked it), and HTTP/2 connections that are done or
// whose tag keep refuses (closing those interrupts their streams).
func (p *Pool[K, T]) Sweep(keep func(T) bool) {
	now := p.now()
	var closeH1 []*Conn
	var closeH2 []*http2.ClientConn
	p.mu.Lock()
	for k, list := range p.idle {
		kept := list[:0]
		for _, e := range list {
			if now.Sub(e.idleAt) > IdleTimeout || !keep(e.tag) {
				closeH1 = append(closeH1, e.c)
				p.nidle--
				continue
			}
			kept = append(kept, e)
		}
		clear(list[len(kept):])
		p.setIdle(k, kept)
	}
	for k, hs := range p.h2 {
		kept := hs[:0]
		for _, h := range hs {
			st := h.cc.State()
			if st.Closed || (!h.cc.CanTakeNewRequest() && st.StreamsActive == 0) || !keep(h.tag) {
				closeH2 = append(closeH2, h.cc)
				continue
			}
			if st.StreamsActive == 0 && now.Sub(st.LastIdle) > IdleTimeout && !st.LastIdle.IsZero() {
				closeH2 = append(closeH2, h.cc)
				continue
			}
			kept = append(kept, h)
		}
		clear(hs[len(kept):])
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

// CloseIdle closes every pooled connection (shutdown).
func (p *Pool[K, T]) CloseIdle() {
	p.Sweep(func(T) bool { return false })
}

func closeAll(us []*Conn) {
	for _, u := range us {
		u.Close()
	}
}
