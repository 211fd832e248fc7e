package h1client

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
)

// Conn is one HTTP/1.1 connection to an origin. The exchange in flight
// owns it; between exchanges the Pool does.
type Conn struct {
	c   net.Conn         // Raw, or a tls.Conn over it
	Raw *connio.IdleConn // the socket, with its idle timeout and byte counts
	// RB is the buffer under the tls.Conn; nil on a plain connection.
	RB  *connio.ReadBuf
	lim limitReader // between BR and c: bounds the response header
	BR  *bufio.Reader
	BW  *bufio.Writer
	// Hdr is the ResponseHeaderTimeout of the exchange in flight.
	Hdr h1.HeaderClock
	// CloseF is Close as a func value, made once: the exchange watch
	// (h1.Watch) names the connection by its address.
	CloseF func()

	// For Alive's peek, set once at Open: the raw socket (nil when it has
	// none), the callback and its result.
	rc       syscall.RawConn
	rcErr    bool
	peekFn   func(fd uintptr) bool
	peekBuf  [1]byte
	peekDead bool
}

// Options are how Open speaks to the origin.
type Options struct {
	// TLS, when set, makes the connection TLS with this configuration
	// (naming the server, offering h2 and http/1.1); nil is plain HTTP.
	TLS *tls.Config
	// HandshakeTimeout bounds the TLS handshake.
	HandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds each response header, from the end of
	// its request (Hdr).
	ResponseHeaderTimeout time.Duration
	// H2 makes the HTTP/2 connection when the origin picks h2.
	H2 *http2.Transport
}

// Open speaks HTTP over raw, a connection the caller dialled: TLS when
// o.TLS is set. An origin that picks HTTP/2 gets an HTTP/2 connection (cc
// set), any other a Conn. On error raw is closed.
func Open(ctx context.Context, raw *connio.IdleConn, o Options) (*Conn, *http2.ClientConn, error) {
	u := &Conn{Raw: raw, c: raw}
	u.CloseF = u.Close
	u.setPeek()
	if o.TLS != nil {
		u.RB = connio.NewReadBuf(raw)
		tc := tls.Client(u.RB, o.TLS)
		hctx, cancel := context.WithTimeout(ctx, o.HandshakeTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			raw.Close()
			return nil, nil, err
		}
		if tc.ConnectionState().NegotiatedProtocol == "h2" {
			cc, err := o.H2.NewClientConn(tc)
			if err != nil {
				tc.Close()
				return nil, nil, err
			}
			return nil, cc, nil
		}
		u.c = tc
	}
	u.Hdr.Start(raw, o.ResponseHeaderTimeout)
	u.lim.r = u.c
	u.BR = bufio.NewReaderSize(&u.lim, readBuf)
	u.BW = bufio.NewWriterSize(u.c, writeBuf)
	return u, nil, nil
}

// TLS reports whether the connection is TLS.
func (u *Conn) TLS() bool { return u.RB != nil }

// Close closes the connection and stops its header clock.
func (u *Conn) Close() {
	u.c.Close()
	u.Hdr.Stop()
}

// LimitHeader starts the header phase of a response: reads past
// MaxResponseHeader fail with ErrResponseHeaderTooLarge until EndHeader.
func (u *Conn) LimitHeader() { u.lim.limited, u.lim.n = true, MaxResponseHeader }

// EndHeader ends the header phase: the body is not bounded.
func (u *Conn) EndHeader() { u.lim.limited = false }

// ResetRead sets the count BytesRead reports to zero.
func (u *Conn) ResetRead() { u.lim.read = 0 }

// BytesRead is the number of bytes read from the origin since ResetRead.
func (u *Conn) BytesRead() int64 { return u.lim.read }

// ErrResponseHeaderTooLarge is a response header past MaxResponseHeader.
var ErrResponseHeaderTooLarge = errors.New("reading upstream response: header larger than 1 MiB")

// limitReader refuses to read more than n bytes while limited; the header
// phase of a response is limited, its body is not.
type limitReader struct {
	r       io.Reader
	limited bool
	n       int64
	read    int64 // bytes read since the counter was last reset
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.limited {
		if l.n <= 0 {
			return 0, ErrResponseHeaderTooLarge
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

// Alive reports whether an idle connection can carry another request: the
// origin has not closed it and sent nothing unasked (on TLS, records may
// wait in the socket: session tickets, which tls.Conn consumes itself). One
// non-blocking peek.
func (u *Conn) Alive() bool {
	if u.BR.Buffered() > 0 {
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

// peek is Alive's non-blocking look at the socket.
func (u *Conn) peek(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), u.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN):
	case err != nil || n == 0:
		u.peekDead = true // reset, or closed by the origin
	case !u.TLS():
		u.peekDead = true // bytes nobody asked for
	}
	return true
}

// setPeek readies Alive's peek for u's socket.
func (u *Conn) setPeek() {
	sc, ok := u.Raw.Conn.(syscall.Conn)
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
