package h1

import (
	"math"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// HeaderClock bounds a wait for a header (the guest's request header,
// HandshakeTimeout; an origin's response header, ResponseHeaderTimeout)
// without a deadline change per request: begin and end only store a time,
// and one timer per connection looks at it. A wait that runs past the
// bound closes the connection, so the read in progress fails, and marks
// the clock expired.
type HeaderClock struct {
	since   atomic.Int64 // unix nanoseconds when the wait started; 0 between waits
	stopped atomic.Bool
	expired atomic.Bool
	d       time.Duration
	c       net.Conn
	t       atomic.Pointer[time.Timer] // set once; its callback may run before start returns
}

// Start arms the clock over c: a wait longer than d closes c. Stop
// disarms it for good.
func (k *HeaderClock) Start(c net.Conn, d time.Duration) {
	k.c, k.d = c, d
	// Armed only once stored, so that check always finds it.
	t := time.AfterFunc(math.MaxInt64, k.check)
	k.t.Store(t)
	t.Reset(d)
}

func (k *HeaderClock) check() {
	if k.stopped.Load() {
		return // a Reset now would keep a closed connection's timer alive
	}
	t := k.t.Load()
	s := k.since.Load()
	if s == 0 {
		t.Reset(k.d)
		return
	}
	late := time.Duration(time.Now().UnixNano() - s)
	if late >= k.d {
		k.expired.Store(true)
		k.c.Close()
		return
	}
	t.Reset(k.d - late)
}

// Expired reports whether a wait ran past the bound (and closed the
// connection).
func (k *HeaderClock) Expired() bool { return k.expired.Load() }

// Begin starts a wait; End ends it.
func (k *HeaderClock) Begin() { k.since.Store(time.Now().UnixNano()) }
func (k *HeaderClock) End()   { k.since.Store(0) }

// Stop disarms the clock for good (the connection is done).
func (k *HeaderClock) Stop() {
	if !k.stopped.Swap(true) {
		if t := k.t.Load(); t != nil {
			t.Stop()
		}
	}
}

// httpDate is the Date field, formatted once per second.
func httpDate() string {
	now := time.Now()
	sec := now.Unix()
	if d := cachedDate.Load(); d != nil && d.sec == sec {
		return d.s
	}
	d := &dateValue{sec: sec, s: now.UTC().Format(http.TimeFormat)}
	cachedDate.Store(d)
	return d.s
}

type dateValue struct {
	sec int64
	s   string
}

var cachedDate atomic.Pointer[dateValue]
