package httpfilter

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/egress"
)

// Capture serves the guest's connections to port 80 or 443 of any
// address that the host redirected to it (docs/hostfw.md, capture): a
// client that ignores the proxy settings is filtered as if it had asked
// the proxy. The name comes from the connection's own bytes, the TLS SNI
// on 443 and the Host header on 80, never from the address the guest
// chose (SO_ORIGINAL_DST, which is logged as orig_dst and nothing else).
// Each connection is handed to the proxy as a CONNECT to NAME:PORT
// followed by the guest's bytes, so that the decision, the resolution
// and the address dialled, interception, fronting checks, request rules,
// revocation and the decision line are the proxy's own, with no second
// copy of any of them here.
type Capture struct {
	p *Proxy
	// ln is the listener the host's DNAT rule sends the guest's
	// connections to; port (80 or 443) is the destination port those
	// connections had, which says whether they carry TLS.
	ln   net.Listener
	port uint16
	sem  chan struct{} // one slot per open connection (the proxy's MaxConns)
	// origDst returns the destination the guest chose (SO_ORIGINAL_DST);
	// tests replace it.
	origDst func(net.Conn) (netip.AddrPort, error)

	captured, refused atomic.Uint64
}

// Reason codes of a captured connection refused before it reaches the
// proxy's decision.
const (
	// ReasonCaptureNoSNI: a ClientHello without a server name; there is
	// no name to decide on, and the destination address is not one.
	ReasonCaptureNoSNI = "capture_no_sni"
	// ReasonCaptureNoHost: a plain request without a Host header.
	ReasonCaptureNoHost = "capture_no_host"
	// ReasonCaptureAddressName: the SNI or the Host is an IP literal. A
	// captured flow must name its destination; an address the guest
	// picked is exactly what capture does not trust.
	ReasonCaptureAddressName = "capture_address_name"
	// ReasonCaptureNotTLS: what arrived on port 443 is not a ClientHello.
	ReasonCaptureNotTLS = "capture_not_tls"
	// ReasonCaptureNotHTTP: what arrived on port 80 is not an HTTP/1.x
	// request head.
	ReasonCaptureNotHTTP = "capture_not_http"
)

// NewCapture returns the capture server for connections whose original
// destination port was port (80: plain HTTP, 443: TLS) on ln.
func (p *Proxy) NewCapture(ln net.Listener, port uint16) (*Capture, error) {
	if port != 80 && port != 443 {
		return nil, fmt.Errorf("capture on port %d: only 80 (plain HTTP) and 443 (TLS) are captured", port)
	}
	if ln == nil {
		return nil, errors.New("capture: no listener")
	}
	return &Capture{p: p, ln: ln, port: port, sem: make(chan struct{}, p.cfg.MaxConns), origDst: originalDst}, nil
}

// Name implements daemon.Service.
func (c *Capture) Name() string { return "capture-" + strconv.Itoa(int(c.port)) }

// Addr is the listening address.
func (c *Capture) Addr() net.Addr { return c.ln.Addr() }

// Stats implements api.Component.
func (c *Capture) Stats() any {
	return map[string]uint64{"captured": c.captured.Load(), "refused": c.refused.Load()}
}

// Serve accepts captured connections until ctx ends. Connections being
// served are the proxy's: its shutdown closes them.
func (c *Capture) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.ln.Close() })
	defer stop()
	var pause time.Duration
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Temporary() { //nolint:staticcheck // as net/http
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			return fmt.Errorf("serving %s: %w", c.Name(), err)
		}
		pause = 0
		go c.serve(ctx, conn)
	}
}

// serve reads the name the connection carries and hands it to the proxy.
func (c *Capture) serve(ctx context.Context, conn net.Conn) {
	defer func() {
		if v := recover(); v != nil {
			c.p.panics.Report("captured connection", v, "client", conn.RemoteAddr().String())
			conn.Close()
		}
	}()
	select {
	case c.sem <- struct{}{}:
	default:
		c.p.stats.connsRefused.Add(1)
		conn.Close()
		c.p.guardRefused(conn.RemoteAddr().String(), "", ReasonTooManyConns)
		return
	}
	release := func() { <-c.sem }
	connio.TuneGuestConn(conn)
	orig, oerr := c.origDst(conn)
	conn.SetReadDeadline(time.Now().Add(c.p.cfg.HandshakeTimeout))
	var (
		name, reason string
		rest         io.Reader
		err          error
	)
	if c.port == 443 {
		name, rest, reason, err = c.readSNI(conn)
	} else {
		name, rest, reason, err = c.readHost(conn)
	}
	conn.SetReadDeadline(time.Time{})
	if reason != "" {
		c.refuse(conn, orig, oerr, reason, err)
		release()
		return
	}
	c.captured.Add(1)
	authority := net.JoinHostPort(name, strconv.Itoa(int(c.port)))
	head := "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n"
	cc := &capturedConn{Conn: conn, r: io.MultiReader(strings.NewReader(head), rest), tls: c.port == 443}
	c.p.serveOuter(ctx, c.p.track(cc, release))
	c.logCapture(conn, orig, oerr, name, cc.opened())
}

// readSNI peeks the ClientHello and returns its server name and a reader
// that replays the hello and what follows it.
func (c *Capture) readSNI(conn net.Conn) (name string, rest io.Reader, reason string, err error) {
	hello, raw, after, err := peekClientHello(conn)
	switch {
	case errors.Is(err, errHelloTrailing):
		return "", nil, ReasonHelloTrailing, err
	case err != nil:
		return "", nil, ReasonCaptureNotTLS, err
	case hello.ServerName == "":
		return "", nil, ReasonCaptureNoSNI, errors.New("client hello carries no server name")
	}
	if reason, err := captureName(hello.ServerName); reason != "" {
		return "", nil, reason, err
	}
	return hello.ServerName, io.MultiReader(bytes.NewReader(raw), after), "", nil
}

// readHost peeks the first request head and returns its Host's name and
// a reader that replays the head and what follows it.
func (c *Capture) readHost(conn net.Conn) (name string, rest io.Reader, reason string, err error) {
	br := bufio.NewReaderSize(conn, c.p.cfg.MaxHeaderBytes)
	var head []byte
	for {
		// Peek past what is buffered waits for (at least) one more read.
		_, perr := br.Peek(min(br.Buffered()+1, c.p.cfg.MaxHeaderBytes))
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			head = b[:i+4]
			break
		}
		if perr != nil || len(b) >= c.p.cfg.MaxHeaderBytes {
			return "", nil, ReasonCaptureNotHTTP, fmt.Errorf("reading the request head: no end within %d bytes: %v", len(b), perr)
		}
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return "", nil, ReasonCaptureNotHTTP, fmt.Errorf("reading the request head: %w", err)
	}
	if req.Host == "" {
		return "", nil, ReasonCaptureNoHost, errors.New("request has no Host header")
	}
	t, err := egress.ParseAuthority(req.Host, 80)
	if err != nil {
		return "", nil, ReasonInvalidTarget, err
	}
	if reason, err := captureName(t.Host()); reason != "" {
		return "", nil, reason, err
	}
	// The port the Host names is left to the proxy: inner requests must
	// name NAME:80, and another port is refused there as fronting.
	return t.Host(), br, "", nil
}

// captureName refuses a name that is an address or that could be more
// than one host name on the CONNECT line made of it.
func captureName(name string) (reason string, err error) {
	if _, perr := netip.ParseAddr(name); perr == nil {
		return ReasonCaptureAddressName, fmt.Errorf("captured connection names the address %q, not a host name", name)
	}
	if len(name) > 253 {
		return ReasonInvalidTarget, fmt.Errorf("host name of %d bytes", len(name))
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '-' || ch == '_') {
			return ReasonInvalidTarget, fmt.Errorf("host name %q holds %q", name, ch)
		}
	}
	return "", nil
}

// refuse ends a captured connection that carries no name it may be
// decided on, and writes its decision line. The guest sees its client
// fail: a TLS client gets an access_denied alert, anything else a reset.
// No HTTP answer: a client that did not ask the proxy cannot be expected
// to read one as a refusal (curl, a probe, a script checking an exit
// status take a 403 for a connection that worked); the reason is in the
// log, with its denial id.
func (c *Capture) refuse(conn net.Conn, orig netip.AddrPort, oerr error, reason string, err error) {
	rec := &record{start: time.Now(), kind: "capture", client: conn.RemoteAddr().String(), port: c.port,
		status: http.StatusForbidden, verdict: allowlist.Block, reason: reason, denialID: newDenialID(),
		err: fmt.Errorf("captured connection to %s: %w", origString(orig, oerr), err)}
	p := c.p
	defer p.finish(rec)
	c.refused.Add(1)
	if c.port == 443 && reason != ReasonCaptureNotTLS {
		conn.Write(tlsAccessDenied)
	}
	resetConn(conn)
}

// resetConn closes c with a TCP reset where it can (SO_LINGER 0), so
// that the client fails at once with "connection reset".
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// tlsAccessDenied is a TLS alert record, fatal access_denied (RFC 8446
// 6.2), sent in the clear before any handshake: the client reports
// "access denied" instead of a bare reset.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

// logCapture writes the line that ties a captured connection to the name
// it was decided on, once the connection is over, after the proxy's own
// line for it. The line of a connection the proxy refused is a refusal's,
// held to the client's budget of them like the refusal itself, so that a
// guest looping on refused captured connections cannot flood the log.
func (c *Capture) logCapture(conn net.Conn, orig netip.AddrPort, oerr error, name string, opened bool) {
	client, dst, port := conn.RemoteAddr().String(), origString(orig, oerr), int64(c.port)
	if c.p.lines != nil {
		l := decisionlog.NewLine(time.Now(), slog.LevelInfo, "capture")
		l.String("kind", "capture").String("client", client).String("host", name).Int("port", port).String("orig_dst", dst).Bool("opened", opened)
		if opened {
			c.p.lines.EmitAllowed(l)
		} else {
			c.p.lines.EmitRefusal(clientAddr(client), "capture", l)
		}
		return
	}
	c.p.dlog.Info("capture", "kind", "capture", "client", client, "host", name, "port", port, "orig_dst", dst, "opened", opened)
}

func origString(orig netip.AddrPort, err error) string {
	if err != nil || !orig.IsValid() {
		return "unknown"
	}
	return orig.String()
}

// capturedConn is a captured connection as the proxy sees it: reads
// start with the CONNECT made for it, and the proxy's answer to that
// CONNECT never reaches the guest, which did not send it. A 200 is
// dropped and the tunnel's bytes pass; a refusal ends the connection as
// Capture.refuse does (a TLS alert, or a reset). Requests refused inside
// the tunnel (fronting, request rules) are answered as on the proxy port.
type capturedConn struct {
	net.Conn
	r   io.Reader
	tls bool

	mu       sync.Mutex
	head     []byte // the answer's head, until its end is seen
	answered bool   // the answer was dealt with; writes pass
}

// maxAnswerHead bounds the proxy's answer to the CONNECT (a few hundred
// bytes in fact).
const maxAnswerHead = 16 << 10

var errCaptureRefused = errors.New("captured connection refused")

func (c *capturedConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// opened reports whether the proxy opened the tunnel (answered 200).
func (c *capturedConn) opened() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.answered
}

func (c *capturedConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered {
		return c.Conn.Write(b)
	}
	c.head = append(c.head, b...)
	end := bytes.Index(c.head, []byte("\r\n\r\n"))
	if end < 0 {
		if len(c.head) > maxAnswerHead {
			c.Conn.Close()
			return 0, errCaptureRefused
		}
		return len(b), nil
	}
	head, after := c.head[:end+4], c.head[end+4:]
	c.head = nil
	switch {
	case bytes.HasPrefix(head, []byte("HTTP/1.1 200 ")):
		c.answered = true
		if len(after) > 0 {
			if _, err := c.Conn.Write(after); err != nil {
				return 0, err
			}
		}
		return len(b), nil
	case c.tls:
		c.Conn.Write(tlsAccessDenied)
	}
	resetConn(c.Conn)
	return 0, errCaptureRefused
}

// CloseWrite half-closes the guest's connection, as the proxy does when
// the origin is done sending.
func (c *capturedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
