package dnsfilter

import (
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// evictingListener bounds the open TCP connections like a limit listener,
// but never makes a new client wait: at the bound, the connection that has
// been quiet longest (idle between queries, or trickling a query byte by
// byte) is closed to make room. A guest that opens max idle or slow
// connections therefore cannot starve DNS over TCP: each new connection
// gets in, and the ones that lose their place are the attacker's own.
type evictingListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	conns map[*trackedConn]struct{}
	// evicted counts connections closed to make room.
	evicted atomic.Uint64
	// log receives one warning per evictLogEvery while evicting (nil:
	// none); lastLog is its unix nanoseconds.
	log     *slog.Logger
	lastLog atomic.Int64
}

// evictLogEvery spaces the warnings of a client holding the TCP slots.
const evictLogEvery = 10 * time.Second

func newEvictingListener(l net.Listener, max int) *evictingListener {
	return &evictingListener{Listener: l, max: max, conns: make(map[*trackedConn]struct{}, max)}
}

func (l *evictingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, l: l}
	tc.touch()
	var victim *trackedConn
	l.mu.Lock()
	if len(l.conns) >= l.max {
		for o := range l.conns {
			if victim == nil || o.last.Load() < victim.last.Load() {
				victim = o
			}
		}
		delete(l.conns, victim)
	}
	l.conns[tc] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		n := l.evicted.Add(1)
		victim.Conn.Close()
		now, last := time.Now().UnixNano(), l.lastLog.Load()
		if l.log != nil && now-last >= int64(evictLogEvery) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Warn("dns tcp connection limit reached; the quietest connection is closed for each new one",
				"max", l.max, "evicted", n, "closed", victim.RemoteAddr().String(), "for", c.RemoteAddr().String())
		}
	}
	return tc, nil
}

// trackedConn records when it last received bytes.
type trackedConn struct {
	net.Conn
	l    *evictingListener
	last atomic.Int64 // unix nanoseconds of the last read that returned data
	once sync.Once
}

func (c *trackedConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *trackedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
