package httpfilter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/secrets"
	"golang.org/x/net/http/httpguts"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// scope is what an intercepted connection was opened for.
type scope struct {
	connect     egress.Target
	authority   string          // connect.Authority(), once per tunnel
	checked     *egress.Checked // what the CONNECT checked; nil for the healthcheck
	scheme      string          // https for intercepted TLS, http for plain bytes in a tunnel
	defaultPort uint16
	sni         string
	// use holds the tunnel (nil for the healthcheck's); an inner
	// WebSocket upgrade decided by rules is recorded on it, so that rules
	// that no longer allow it close the tunnel it took over.
	use *liveUse
	// keys is the TLS session's key log writer (nil for plain bytes in a
	// tunnel): an injection marks it so that its keys are not logged.
	keys *sessionKeys
}

type scopeKey struct{}

// fwdKey carries the checked target of one request to the transport's dialer.
type fwdKey struct{}

type fwdState struct {
	checked     *egress.Checked
	scheme      string
	defaultPort uint16
	rec         *record
	// ruled: the host has request rules (or a secret's binding decided
	// the request), and target is the path and query they decided, sent
	// in that form (Target.SetURL).
	ruled  bool
	target reqrules.Target
	sent   atomic.Int64 // request body bytes sent upstream
	// One allocation with the state: the guest's answer, the request sent
	// upstream and its URL, the hold on the target.
	cw     countingWriter
	out    http.Request
	outURL url.URL
	use    liveUse
}

// ServeHTTP handles the guest's connection to the proxy: absolute-form
// plain HTTP and CONNECT; anything else is a 400 that says what to send.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.serveOuterRequest(r.Context(), w, r)
}

// serveOuterRequest is ServeHTTP with the request's context passed apart
// (the server loop gives its requests none: see h1.Handler).
func (p *Proxy) serveOuterRequest(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	w = closeAfterUpgrade(w, r)
	rec := &record{start: time.Now(), kind: "http", client: r.RemoteAddr, method: r.Method}
	// The one place the line is written: no return (nor the panic that
	// aborts a broken answer) can leave a request unlogged.
	defer p.finish(rec)
	if status, reason := requestRefusal(r); reason != "" {
		rec.path = pathOnly(r)
		if r.Method == http.MethodConnect {
			rec.kind = "connect"
		}
		p.refuse(w, rec, status, reason, true)
		return
	}
	if !p.admit(ctx) {
		if r.Method == http.MethodConnect {
			rec.kind = "connect"
		}
		rec.host = r.Host
		p.refuseRate(w, rec, r.Method == http.MethodConnect)
		return
	}
	switch {
	case r.Method == http.MethodConnect:
		rec.kind = "connect"
		p.serveConnect(ctx, w, r, rec)
		return
	case r.URL.IsAbs() && r.URL.Scheme == "http":
		rec.path = pathOnly(r)
		if r.URL.User != nil {
			p.refuse(w, rec, http.StatusBadRequest, ReasonUserinfo, true)
			return
		}
		t, err := egress.ParseAuthority(requestAuthority(r), 80)
		if err != nil {
			rec.err = err
			p.refuse(w, rec, http.StatusBadRequest, ReasonInvalidTarget, true)
			return
		}
		p.serveForward(ctx, w, r, rec, t, "http", 80, nil)
	case r.URL.IsAbs() && r.URL.Scheme == "https":
		rec.host = r.URL.Hostname()
		p.refuse(w, rec, http.StatusBadRequest, ReasonHTTPSInAbsolute, false)
	default:
		rec.path = pathOnly(r)
		rec.verdict, rec.reason, rec.status = allowlist.Block, ReasonNotProxyRequest, http.StatusBadRequest
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Abox-Reason", ReasonNotProxyRequest)
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, "abox proxy: this is a forward proxy: send absolute-form requests (GET http://host/path) or CONNECT host:port\n")
	}
}

// serveInner handles a request inside an intercepted tunnel. Its Host (or
// :authority) must name the CONNECT target, and it is decided again.
func (p *Proxy) serveInner(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	w = closeAfterUpgrade(w, r)
	sc, _ := ctx.Value(scopeKey{}).(*scope)
	rec := &record{start: time.Now(), kind: "inner", client: r.RemoteAddr, method: r.Method, path: pathOnly(r)}
	defer p.finish(rec)
	if sc == nil {
		p.refuse(w, rec, http.StatusInternalServerError, "no_scope", true)
		return
	}
	rec.connect = sc.authority
	rec.sni = sc.sni
	rec.setTarget(sc.connect)
	// An HTTP/1 refusal closes the connection; on HTTP/2 only the stream
	// ends (a Connection: close header would make the server send GOAWAY
	// and take the guest's other streams with it).
	h1 := r.ProtoMajor == 1
	if status, reason := requestRefusal(r); reason != "" {
		p.refuse(w, rec, status, reason, h1)
		return
	}
	if !p.admit(ctx) {
		p.refuseRate(w, rec, false)
		return
	}
	if r.Method == http.MethodConnect {
		p.refuse(w, rec, http.StatusForbidden, ReasonConnectInTunnel, h1)
		return
	}
	if err := innerTargetError(r); err != nil {
		rec.asked = r.Host
		rec.err = err
		p.refuse(w, rec, http.StatusBadRequest, ReasonInvalidTarget, h1)
		return
	}
	t, err := egress.ParseAuthority(requestAuthority(r), sc.defaultPort)
	if err != nil {
		rec.asked = r.Host
		rec.err = err
		p.refuse(w, rec, http.StatusBadRequest, ReasonInvalidTarget, h1)
		return
	}
	if !t.Same(sc.connect) {
		rec.asked = t.Authority()
		if !h1 {
			// RFC 9113 9.1.2: this connection cannot serve that
			// authority; the client may retry it on a connection of its own.
			p.refuse(w, rec, http.StatusMisdirectedRequest, ReasonDomainFronting, false)
			return
		}
		p.refuse(w, rec, http.StatusForbidden, ReasonDomainFronting, true)
		return
	}
	r.Header.Del("Host")
	p.serveForward(ctx, w, r, rec, t, sc.scheme, sc.defaultPort, sc.checked)
}

// serveForward decides t and r's method and path, and forwards r to
// exactly the checked address, with the path in the form decided; pinned
// is the tunnel's checked target for an inner request. The caller writes
// the log line.
func (p *Proxy) serveForward(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *record, t egress.Target, scheme string, defPort uint16, pinned *egress.Checked) {
	rec.setTarget(t)
	if reason := upgradeRefusal(r.Header); reason != "" {
		p.refuse(w, rec, http.StatusBadRequest, reason, true)
		return
	}
	d := p.decide(ctx, t, pinned, &request{method: r.Method, target: r.RequestURI})
	rec.apply(d)
	if d.healthcheck {
		if r.Body != nil {
			io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		}
		serveHealth(w, rec)
		return
	}
	if d.verdict != allowlist.Allow {
		p.refuse(w, rec, d.status, d.reason, false)
		return
	}
	// A push is held to its refs first (it reads the ref updates and
	// replays them); the request that goes on then gets its secrets.
	if p.holdPush(w, r, rec, d) {
		return
	}
	if !p.applySecrets(ctx, w, r, rec, t, scheme, &d) {
		return
	}
	st := &fwdState{checked: d.checked, scheme: scheme, defaultPort: defPort, rec: rec, ruled: d.rules != nil || d.canonical, target: d.target}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &countingBody{ReadCloser: relayUpload(r), n: &st.sent}
	}
	st.cw = countingWriter{ResponseWriter: w, rec: rec, upgrade: len(r.Header["Upgrade"]) > 0}
	cw := &st.cw
	// A plain-HTTP exchange on the guest's own connection may stream or
	// upgrade for hours: hold it for this target. (Inside a CONNECT tunnel
	// the tunnel itself is held.)
	var use *liveUse
	if c, ok := ctx.Value(connKey{}).(net.Conn); ok {
		use = &st.use
		if d.rules != nil {
			use.rq, use.ruled = request{method: r.Method, target: r.RequestURI, list: d.list, mode: d.mode}, true
		}
		p.holdAs(use, t)
		defer p.unhold(use)
		if !use.attach(c) {
			// The policy changed while this request was being decided.
			p.refuse(w, rec, http.StatusForbidden, ReasonRevoked, true)
			return
		}
	}
	if sc, _ := ctx.Value(scopeKey{}).(*scope); sc != nil && sc.use != nil && d.rules != nil && cw.upgrade && r.ProtoMajor == 1 {
		// The tunnel's HTTP/1.1 connection is the WebSocket's from now on
		// (an upgrade refused upstream closes it): the rules that decided
		// the upgrade keep deciding it.
		sc.use.setRequest(request{method: r.Method, target: r.RequestURI, list: d.list, mode: d.mode})
		if !p.useAllowed(sc.use) {
			p.refuse(w, rec, http.StatusForbidden, ReasonRevoked, true)
			return
		}
	}
	if !p.acquireUpstream(ctx) {
		p.refuse(w, rec, http.StatusServiceUnavailable, ReasonUpstreamBusy, false)
		return
	}
	defer p.releaseUpstream()
	abort := p.forward(ctx, cw, r, st)
	rec.up = st.sent.Load()
	if use != nil && use.revoked.Load() {
		rec.verdict, rec.reason = allowlist.Block, ReasonRevoked
	}
	if rec.status == 0 {
		rec.status = cw.status
		if rec.status == 0 && cw.upgrade {
			rec.status = http.StatusSwitchingProtocols // ReverseProxy hijacked
		}
	}
	if cw.status == 0 && !cw.upgrade && ctx.Err() != nil {
		// The guest left, or a revocation or shutdown ended the exchange,
		// before any answer: the connection ends without one (left to the
		// server, it would answer an empty 200).
		abort = true
	}
	if abort {
		// The answer broke after its header: the guest must not take a
		// truncated body for a whole one.
		panic(http.ErrAbortHandler)
	}
}

// upgradeRefusal allows WebSocket upgrades only; h2c would carry requests
// the proxy never sees.
func upgradeRefusal(h http.Header) string {
	if h.Get("Http2-Settings") != "" {
		return ReasonH2CUpgrade
	}
	if len(h["Upgrade"]) == 0 {
		return ""
	}
	for _, v := range h["Upgrade"] {
		for _, tok := range strings.Split(v, ",") {
			tok = strings.ToLower(strings.TrimSpace(tok))
			if strings.HasPrefix(tok, "h2c") {
				return ReasonH2CUpgrade
			}
			if tok != "websocket" {
				return ReasonUpgradeRefused
			}
		}
	}
	if !httpguts.HeaderValuesContainsToken(h["Connection"], "upgrade") {
		return ReasonUpgradeRefused
	}
	return ""
}

// rewrite points the outgoing request at the checked target. ReverseProxy
// has already removed the hop-by-hop headers, including Proxy-Authorization
// and every name listed in Connection.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	st := pr.In.Context().Value(fwdKey{}).(*fwdState)
	t := st.checked.Target
	upstreamURL(pr.Out.URL, pr.In.URL, st.scheme, t.Authority())
	if st.ruled {
		st.target.SetURL(pr.Out.URL)
	}
	pr.Out.Host = t.HostHeader(st.defaultPort)
	pr.Out.Header.Del("Proxy-Authorization")
	pr.Out.Header.Del("Proxy-Connection")
	pr.Out.Header.Del("Proxy-Authenticate")
	removeRoutingFields(pr.Out.Header)
}

var errUnchecked = errors.New("dialing upstream: no checked target for this request")

// dialUpstream is the transport's only way out: it dials the addresses the
// decision checked and refuses anything else, so the transport never
// resolves a name on its own.
func (p *Proxy) dialUpstream(ctx context.Context, network, addr string) (net.Conn, error) {
	st, _ := ctx.Value(fwdKey{}).(*fwdState)
	if st == nil || st.checked == nil {
		return nil, errUnchecked
	}
	if addr != st.checked.Target.Authority() {
		return nil, fmt.Errorf("dialing upstream: transport asked for %s, checked %s", addr, st.checked.Target.Authority())
	}
	c, err := p.guard.Dial(ctx, st.checked)
	if err != nil {
		return nil, err
	}
	p.stats.upstreamDials.Add(1)
	return connio.NewIdleConn(c, p.cfg.IdleTimeout, nil), nil
}

// upstreamError maps a transport failure to 502 or 504 with a reason code;
// the error text goes to the log only.
func (p *Proxy) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := r.Context().Value(fwdKey{}).(*fwdState)
	rec := &record{}
	if st != nil {
		rec = st.rec
	}
	p.failUpstream(r.Context(), w, rec, err)
}

// failUpstream answers a request the upstream failed before any answer.
func (p *Proxy) failUpstream(ctx context.Context, w http.ResponseWriter, rec *record, err error) {
	if leak := rec.bodyLeak.Load(); leak != nil {
		// The body was stopped at a placeholder (scanRest): a leak,
		// refused as the secrets step refuses one.
		rec.secret = *leak
		p.refuse(w, rec, http.StatusForbidden, secrets.ReasonSecretLeak, true)
		return
	}
	rec.err = err
	status, reason := classifyUpstreamErr(err)
	if ctx.Err() != nil {
		// The guest went away; nobody reads this answer.
		rec.verdict, rec.reason, rec.status = allowlist.Allow, "client_gone", 499
		return
	}
	p.refuse(w, rec, status, reason, false)
	rec.verdict = allowlist.Allow // the policy allowed it; the upstream failed
}

func classifyUpstreamErr(err error) (int, string) {
	var ne net.Error
	var cve *tls.CertificateVerificationError
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var rh tls.RecordHeaderError
	var op *net.OpError
	switch {
	case errors.Is(err, errGuestBodyCut):
		return http.StatusBadRequest, ReasonBodyCut
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return http.StatusGatewayTimeout, ReasonUpstreamTimeout
	case errors.As(err, &cve), errors.As(err, &ua), errors.As(err, &hn), errors.As(err, &ci), errors.As(err, &rh):
		return http.StatusBadGateway, ReasonUpstreamTLS
	case errors.As(err, &op) && op.Op == "dial", strings.HasPrefix(err.Error(), "dialing "):
		return http.StatusBadGateway, ReasonUpstreamConnect
	}
	return http.StatusBadGateway, ReasonUpstreamError
}

// closeAfterUpgrade makes any answer to an Upgrade request other than 101
// close the connection: the h1 guard stops parsing a connection once it has
// seen an Upgrade request, so nothing may follow on it unguarded.
func closeAfterUpgrade(w http.ResponseWriter, r *http.Request) http.ResponseWriter {
	if r.ProtoMajor != 1 || len(r.Header["Upgrade"]) == 0 {
		return w
	}
	return &upgradeCloser{ResponseWriter: w}
}

type upgradeCloser struct {
	http.ResponseWriter
	wrote bool
}

func (u *upgradeCloser) WriteHeader(code int) {
	if !u.wrote {
		u.wrote = true
		if code != http.StatusSwitchingProtocols {
			u.Header().Set("Connection", "close")
		}
	}
	u.ResponseWriter.WriteHeader(code)
}

func (u *upgradeCloser) Write(b []byte) (int, error) {
	if !u.wrote {
		u.WriteHeader(http.StatusOK)
	}
	return u.ResponseWriter.Write(b)
}

func (u *upgradeCloser) Unwrap() http.ResponseWriter { return u.ResponseWriter }

// countingBody counts request body bytes sent upstream.
type countingBody struct {
	io.ReadCloser
	n      *atomic.Int64 // written by whoever sends the body, read by the handler
	broken atomic.Bool   // the guest's body failed (cut, bad chunking)
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(int64(n))
	if err != nil && err != io.EOF {
		b.broken.Store(true)
	}
	return n, err
}

// replayBody is a body whose first bytes were read ahead (a push's ref
// updates, a prefix searched for placeholders): prefix, then err if
// reading them failed, else the rest.
type replayBody struct {
	io.ReadCloser
	prefix []byte
	err    error
}

func (b *replayBody) Read(p []byte) (int, error) {
	if len(b.prefix) > 0 {
		n := copy(p, b.prefix)
		b.prefix = b.prefix[n:]
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	return b.ReadCloser.Read(p)
}

// countingWriter counts response bytes and records the status.
type countingWriter struct {
	http.ResponseWriter
	rec     *record
	status  int
	upgrade bool
}

func (w *countingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.rec.down += int64(n)
	return n, err
}

// ReadFrom passes a body source on to the response writer (net/http's
// moves a spliceBody inside the kernel) and counts it.
func (w *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	var n int64
	var err error
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		n, err = connio.CopyVia(w.ResponseWriter, r)
	}
	w.rec.down += n
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
