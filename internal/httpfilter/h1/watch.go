package h1

import (
	"net/http"
	"sync/atomic"
)

// Watch closes the upstream connection of the exchange in flight on one
// guest HTTP/1 connection when that connection's context ends (the guest
// left, a revocation closed its connection, shutdown). Serve registers it
// once per connection with context.AfterFunc, where each exchange would
// otherwise register (and allocate) a callback of its own.
//
// An exchange names its connection by its close function's address (a
// func value made once per upstream connection), so that nothing is
// allocated per exchange.
type Watch struct {
	done atomic.Bool
	cur  atomic.Pointer[func()]
}

// fire runs when the context ends.
func (x *Watch) fire() {
	x.done.Store(true)
	if c := x.cur.Swap(nil); c != nil {
		(*c)()
	}
}

// Begin makes close the one to call; false when the context has already
// ended (the caller closes its connection).
func (x *Watch) Begin(close *func()) bool {
	x.cur.Store(close)
	if x.done.Load() {
		x.cur.CompareAndSwap(close, nil)
		return false
	}
	return true
}

// End reports whether the context left close alone while it was current
// (as the stop function context.AfterFunc returns).
func (x *Watch) End(close *func()) bool { return x.cur.CompareAndSwap(close, nil) }

// WatchOf returns the watch of the HTTP/1 guest connection w answers on,
// nil for any other writer (HTTP/2 inside a tunnel).
func WatchOf(w http.ResponseWriter) *Watch {
	if hw, ok := w.(*h1Response); ok {
		return &hw.hc.watch
	}
	return nil
}
