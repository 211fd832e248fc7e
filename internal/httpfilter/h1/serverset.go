package h1

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/contain"
)

// Server serves HTTP/1.x connections (Serve) and keeps the set of those it
// is serving, for shutdown. The zero value is ready once its fields are set.
type Server struct {
	// HeaderTimeout bounds the wait for each request header.
	HeaderTimeout time.Duration
	// Panics is told of a handler's panic (not http.ErrAbortHandler); nil
	// reports nothing.
	Panics *contain.Reporter

	// closing is set when shutdown starts; conns are the connections
	// being served (not hijacked ones), whose idle ones CloseIdle closes.
	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*h1Conn]struct{}
}

// Shutdown stops serving: connections waiting for their next request end
// instead, and Serve refuses new ones. It does not wait (see CloseIdle).
func (s *Server) Shutdown() { s.closing.Store(true) }

// ShuttingDown reports whether Shutdown was called.
func (s *Server) ShuttingDown() bool { return s.closing.Load() }

// add registers a served connection for shutdown; false once the server
// is shutting down.
func (s *Server) add(hc *h1Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	if s.conns == nil {
		s.conns = map[*h1Conn]struct{}{}
	}
	s.conns[hc] = struct{}{}
	return true
}

func (s *Server) remove(hc *h1Conn) {
	s.mu.Lock()
	delete(s.conns, hc)
	s.mu.Unlock()
}

// CloseIdle closes the connections waiting for a request and reports how
// many are still serving one.
func (s *Server) CloseIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := 0
	for hc := range s.conns {
		if hc.idle.Load() {
			hc.c.Close()
		} else {
			busy++
		}
	}
	return busy
}

// Open is how many connections are being served (hijacked ones left).
func (s *Server) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}
