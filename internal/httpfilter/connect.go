package httpfilter

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// serveConnect decides a CONNECT, then intercepts the tunnel (default),
// tunnels it after checking the ClientHello (exceptions, --no-mitm), or
// answers the healthcheck itself. The caller writes the log line.
func (p *Proxy) serveConnect(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *record) {
	t, err := egress.ParseAuthority(requestAuthority(r), 0)
	if u := r.URL; err == nil && (r.RequestURI == "" || r.RequestURI[0] == '/' ||
		u.Path != "" || u.RawPath != "" || u.RawQuery != "" || u.ForceQuery || u.User != nil || u.Opaque != "") {
		// RFC 9110 9.3.6: a CONNECT names its target in authority form.
		// net/http also takes "CONNECT /path" and then uses the Host
		// header, and reads "CONNECT a:1/p", "a:1?q" and "u@a:1" as URLs
		// whose host it keeps: a target that is not exactly host:port is
		// refused, not guessed (TestConnectNeedsAuthorityForm).
		err = fmt.Errorf("%w: CONNECT target %q is not host:port", egress.ErrInvalidTarget, r.RequestURI)
	}
	if err != nil {
		rec.host, rec.err = r.Host, err
		p.refuse(w, rec, http.StatusBadRequest, ReasonInvalidTarget, true)
		return
	}
	rec.setTarget(t)
	d := p.decide(ctx, t, nil, nil)
	rec.apply(d)
	if d.verdict != allowlist.Allow {
		p.refuse(w, rec, d.status, d.reason, true)
		return
	}
	use := p.hold(t)
	defer p.unhold(use)
	if use.revoked.Load() {
		p.refuse(w, rec, http.StatusForbidden, ReasonRevoked, true)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		rec.err = err
		p.refuse(w, rec, http.StatusInternalServerError, "hijack_failed", true)
		return
	}
	defer conn.Close()
	// Revocation closes the guest's connection and ends the context of
	// the inner request in flight with it.
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if !use.attach(&guestConn{Conn: conn, cancel: cancel}) {
		// Revoked between the check and the hijack: nothing was answered
		// yet, and nothing will be.
		rec.verdict, rec.reason, rec.status = allowlist.Block, ReasonRevoked, http.StatusForbidden
		io.WriteString(conn, "HTTP/1.1 403 Forbidden\r\nX-Abox-Reason: "+ReasonRevoked+"\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
		return
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		rec.err, rec.status = err, 499
		return
	}
	rec.status = http.StatusOK
	client := connio.WithBuffered(conn, brw.Reader)
	p.stats.tunnelsOpen.Add(1)
	defer p.stats.tunnelsOpen.Add(-1)
	switch {
	case d.healthcheck:
		// Answered here in every mode, TLS included: nothing leaves the host.
		rec.mode = "healthcheck"
		p.intercept(ctx, client, t, nil, rec, nil)
	case p.tunnelled.Has(t) && d.rules == nil && d.list.Push(d.rule) == nil:
		// A host with request rules is always intercepted: a tunnel
		// would carry requests no rule saw (Tunnelled.Check keeps such a
		// list out of force; this holds whatever list is in force).
		rec.mode = "tunnel"
		p.stats.tunnels.Add(1)
		p.tunnel(ctx, client, d.checked, rec)
	default:
		rec.mode = "mitm"
		p.stats.intercepted.Add(1)
		p.intercept(ctx, client, t, d.checked, rec, use)
	}
	if use.revoked.Load() {
		rec.verdict, rec.reason = allowlist.Block, ReasonRevoked
	}
	if rec.verdict == allowlist.Block {
		// Refused after the 200 (SNI checks): the guest sees a closed
		// connection; the id ties the log line to the report.
		rec.denialID = newDenialID()
	}
	if rec.mode != "tunnel" {
		// Intercepted bytes are counted per inner request; the tunnel line
		// carries the raw totals of the connection.
		if g, ok := conn.(*connio.H1Guard); ok {
			if ic, ok := g.Conn.(*connio.IdleConn); ok {
				rec.up, rec.down = ic.Received(), ic.Sent()
			}
		}
	}
}

var errHelloRead = errors.New("client hello read")

// recordingConn feeds a TLS server the client's bytes while keeping a copy,
// and swallows everything the server writes.
type recordingConn struct {
	net.Conn
	buf bytes.Buffer
}

func (c *recordingConn) Read(b []byte) (int, error) {
	if c.buf.Len() > 64<<10 {
		return 0, errors.New("client hello too large")
	}
	n, err := c.Conn.Read(b)
	c.buf.Write(b[:n])
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error) { return len(b), nil }

// peekClientHello reads the ClientHello without answering it and returns
// the hello, the bytes of its records (to be replayed to the upstream) and
// c with whatever the client sent behind them put back in front: those
// bytes are no part of what was checked (a second hello sent ahead of a
// HelloRetryRequest is checked when its turn comes).
func peekClientHello(c net.Conn) (*tls.ClientHelloInfo, []byte, net.Conn, error) {
	rc := &recordingConn{Conn: c}
	var hello *tls.ClientHelloInfo
	err := tls.Server(rc, &tls.Config{
		GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			hello = h
			return nil, errHelloRead
		},
	}).Handshake()
	buf := rc.buf.Bytes()
	if hello == nil {
		return nil, buf, c, fmt.Errorf("reading client hello: %w", err)
	}
	n, clean := helloSpan(buf)
	if !clean {
		return nil, buf[:n], c, errHelloTrailing
	}
	return hello, buf[:n], connio.WithPrefix(c, bytes.Clone(buf[n:])), nil
}

// sniMatches reports whether a ClientHello's server name is the CONNECT host,
// spelled as a host name is in TLS (RFC 6066: ASCII, IDNs as A-labels; any
// case). A name that matches only once decoded (percent-encoding, Unicode
// that IDNA maps onto it) is another spelling: the origin of a byte tunnel
// reads the raw bytes, not the proxy's decoding of them.
func sniMatches(sni string, t egress.Target) bool {
	for i := 0; i < len(sni); i++ {
		if c := sni[i]; c >= 0x80 || c == '%' {
			return false
		}
	}
	st, err := egress.ParseHost(sni)
	return err == nil && st.Name == t.Name && st.Addr == t.Addr
}

// tunnel relays bytes after checking that the ClientHello names the CONNECT
// host and hides no other (ECH, ESNI); a missing or different SNI closes the
// tunnel before any byte leaves. When the server answers with a
// HelloRetryRequest, the client's second ClientHello is checked the same way
// before it is relayed: it must name the same server.
func (p *Proxy) tunnel(ctx context.Context, client net.Conn, checked *egress.Checked, rec *record) {
	client.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	hello, raw, client, err := peekClientHello(client)
	client.SetReadDeadline(time.Time{})
	if !helloAccepted(rec, hello, err, checked.Target) {
		return
	}
	rec.sni = hello.ServerName
	up, err := p.guard.Dial(ctx, checked)
	if err != nil {
		rec.err = err
		rec.reason = ReasonUpstreamConnect
		p.stats.upstreamErrors.Add(1)
		return
	}
	p.stats.upstreamDials.Add(1)
	upc := connio.NewIdleConn(up, p.cfg.IdleTimeout, nil)
	defer upc.Close()
	if _, err := upc.Write(raw); err != nil {
		rec.err = err
		return
	}
	rec.up = int64(len(raw))
	upc.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	sh, hrr, err := readServerHello(upc)
	upc.SetReadDeadline(time.Time{})
	if _, werr := client.Write(sh); werr != nil || err != nil {
		rec.err = errors.Join(err, werr)
		rec.down = int64(len(sh))
		return
	}
	rec.down = int64(len(sh))
	if hrr {
		client.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
		var h2 *tls.ClientHelloInfo
		h2, raw, client, err = secondHello(client)
		client.SetReadDeadline(time.Time{})
		if !helloAccepted(rec, h2, err, checked.Target) {
			return
		}
		if !sameServer(hello, h2) {
			rec.verdict, rec.reason, rec.sni = allowlist.Block, ReasonHelloRetryChanged, h2.ServerName
			return
		}
		if _, err := upc.Write(raw); err != nil {
			rec.err = err
			return
		}
		rec.up += int64(len(raw))
	}
	ab, ba := connio.Pipe(client, upc, p.panics)
	rec.up += ab
	rec.down += ba
}

// intercept terminates the guest's TLS with a leaf from the instance CA and
// serves the inner requests, each decided again by serveInner against the
// addresses the CONNECT checked. Bytes that are not TLS are served as plain
// HTTP under the same rules. use holds the tunnel (nil for the
// healthcheck): an inner WebSocket upgrade is recorded on it.
func (p *Proxy) intercept(ctx context.Context, client net.Conn, t egress.Target, checked *egress.Checked, rec *record, use *liveUse) {
	client.SetReadDeadline(time.Now().Add(p.cfg.HandshakeTimeout))
	var first [1]byte
	if _, err := io.ReadFull(client, first[:]); err != nil {
		rec.err = err
		return
	}
	client = connio.WithPrefix(client, first[:])
	sc := &scope{connect: t, authority: t.Authority(), checked: checked, scheme: "https", defaultPort: 443, use: use}
	if first[0] != 0x16 { // not a TLS handshake record
		client.SetReadDeadline(time.Time{})
		sc.scheme, sc.defaultPort = "http", 80
		p.serveInnerH1(ctx, client, sc)
		return
	}
	var sniErr string
	sc.keys = p.keylog.session(p.sessionBinds(t))
	defer sc.keys.end()
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2", "http/1.1"},
		KeyLogWriter: sc.keys,
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			// No SNI is normal for IP literals; inner requests are still
			// held to the CONNECT host.
			if h.ServerName != "" && !sniMatches(h.ServerName, t) {
				sniErr = h.ServerName
				return nil, errors.New("sni does not match the connect host")
			}
			return p.cfg.CA.Leaf(t.Host())
		},
	}
	fc := connio.NewCoalescedServer(client, cfg)
	tc := fc.Conn
	hctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	err := tc.HandshakeContext(hctx)
	cancel()
	client.SetReadDeadline(time.Time{})
	if err != nil {
		rec.err = err
		if sniErr != "" {
			rec.verdict, rec.reason, rec.sni = allowlist.Block, ReasonSNIMismatch, sniErr
		} else {
			rec.reason = ReasonClientHandshake
		}
		return
	}
	cs := tc.ConnectionState()
	sc.sni = cs.ServerName
	rec.sni = cs.ServerName
	if cs.NegotiatedProtocol == "h2" {
		p.h2.ServeConn(fc, &http2.ServeConnOpts{
			Context:    context.WithValue(ctx, scopeKey{}, sc),
			Handler:    http.HandlerFunc(p.serveInnerH2),
			BaseConfig: p.inner,
		})
		fc.Close()
		return
	}
	p.serveInnerH1(ctx, fc, sc)
}

// serveInnerH2 serves one intercepted HTTP/2 stream. x/net's server
// recovers a handler's panic and resets the stream, but logs it where the
// proxy discards (its ErrorLog): the panic is reported here first.
func (p *Proxy) serveInnerH2(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				p.panics.Report("http/2 stream", v, "client", r.RemoteAddr)
			}
			panic(http.ErrAbortHandler)
		}
	}()
	p.serveInner(r.Context(), w, r)
	finishUpload(w, r)
}

// serveInnerH1 serves an intercepted HTTP/1.x connection behind its own h1
// guard until it ends. Its requests carry the tunnel's scope and not the
// guest's outer connection: the tunnel itself is held.
func (p *Proxy) serveInnerH1(ctx context.Context, c net.Conn, sc *scope) {
	onReject := func(reason string) { p.guardRefused(c.RemoteAddr().String(), sc.authority, reason) }
	ctx = context.WithValue(context.WithValue(ctx, connKey{}, nil), scopeKey{}, sc)
	p.srv.Serve(ctx, connio.NewH1Guard(c, p.cfg.MaxHeaderBytes, onReject), p.serveInner)
}
