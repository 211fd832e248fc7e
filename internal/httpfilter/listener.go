package httpfilter

import (
	"fmt"
	"net"
	"time"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// limitListener caps concurrent connections. A connection over the cap gets
// a 503 and is closed at once instead of queueing in the kernel backlog,
// where the guest could hold the proxy's file descriptors.
type limitListener struct {
	net.Listener
	p   *Proxy
	sem chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			connio.TuneGuestConn(c)
			return l.p.track(c, func() { <-l.sem }), nil
		default:
			l.p.stats.connsRefused.Add(1)
			go func() {
				refuseConn(c)
				// A blocked line, folded per client as every refusal is:
				// the limit's trips are in the refusal stream.
				l.p.guardRefused(c.RemoteAddr().String(), "", ReasonTooManyConns)
			}()
		}
	}
}

const tooManyBody = "abox proxy: too many connections\n"

func refuseConn(c net.Conn) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nX-Abox-Reason: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		ReasonTooManyConns, len(tooManyBody), tooManyBody)
	c.Close()
}
