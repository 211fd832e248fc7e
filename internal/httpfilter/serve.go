package httpfilter

import (
	"context"
	"errors"
	"net"
	"time"
)

// The proxy's side of serving a guest connection: the accept loop, and
// what wraps each connection before the HTTP/1 engine (internal/httpfilter/h1)
// serves it with the proxy's handler.

// guestConn is the guest's connection as revocation sees it: closing it
// also ends the context of the request in flight (its upstream exchange).
type guestConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (g *guestConn) Close() error {
	g.cancel()
	return g.Conn.Close()
}

// serveOuter serves a connection accepted on the proxy's listener. A panic
// anywhere in serving it (the server loop, a CONNECT tunnel, an
// interception) ends this connection only, not the daemon.
func (p *Proxy) serveOuter(ctx context.Context, c net.Conn) {
	defer func() {
		if v := recover(); v != nil {
			p.panics.Report("http connection", v, "client", c.RemoteAddr().String())
			c.Close()
		}
	}()
	ctx, cancel := context.WithCancel(withClient(ctx, c))
	defer cancel()
	ctx = context.WithValue(ctx, connKey{}, net.Conn(&guestConn{Conn: c, cancel: cancel}))
	p.srv.Serve(ctx, c, p.serveOuterRequest)
}

// acceptLoop serves every connection the listener accepts until it is
// closed; temporary errors (out of file descriptors) are retried with a
// growing pause, as net/http does.
func (p *Proxy) acceptLoop(ctx context.Context, ln net.Listener) error {
	var pause time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.srv.ShuttingDown() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Temporary() { //nolint:staticcheck // as net/http
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				p.log.Warn("accepting a connection", "err", err, "retry_in", pause)
				time.Sleep(pause)
				continue
			}
			return err
		}
		pause = 0
		go p.serveOuter(ctx, c)
	}
}
