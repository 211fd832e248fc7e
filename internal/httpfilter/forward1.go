package httpfilter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"strings"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
	"github.com/abox-dev/abox/internal/httpfilter/h1client"
)

// errGuestBodyCut is the engine's error for a body the guest cut before
// the origin answered (classifyUpstreamErr answers it 400 body_cut).
var errGuestBodyCut = h1client.ErrBodyCut

// forward sends r to the checked target of st and streams the answer to w:
// HTTP/1.1 over the proxy's own pooled connections, HTTP/2 over a shared
// connection to origins that offer it, WebSocket upgrades through
// ReverseProxy. It reports whether the guest's answer must be aborted (the
// body broke after the header).
func (p *Proxy) forward(ctx context.Context, w *countingWriter, r *http.Request, st *fwdState) (abort bool) {
	if w.upgrade {
		return p.reverseProxy(ctx, w, r, st)
	}
	useTLS := st.scheme == "https"
	for attempt := 0; ; attempt++ {
		var u *h1client.Conn
		var cc *http2.ClientConn
		var k upstreamKey
		reused := false
		if attempt == 0 {
			u, cc, k = p.pooled(st.checked, useTLS)
			reused = u != nil
		}
		if u == nil && cc == nil {
			var err error
			u, cc, k, err = p.dialUpstreamConn(ctx, st)
			if err != nil {
				p.failUpstream(ctx, w, st.rec, err)
				return false
			}
		}
		var abort bool
		var err error
		if cc != nil {
			abort, err = p.exchangeH2(ctx, w, r, st, cc)
		} else {
			abort, err = p.exchange(ctx, w, r, st, u, k)
		}
		if reused && h1client.Retryable(err, r) {
			continue
		}
		if err != nil {
			p.failUpstream(ctx, w, st.rec, err)
		}
		return abort
	}
}

func (p *Proxy) reverseProxy(ctx context.Context, w *countingWriter, r *http.Request, st *fwdState) (abort bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			abort = true
		}
	}()
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(ctx, fwdKey{}, st)))
	return false
}

// exchange writes r on u and copies the response to w; a clean end puts u
// back in the pool under k. An error is returned only while nothing was
// answered to the guest (the caller answers 502/504); abort means the
// answer broke after its header.
func (p *Proxy) exchange(ctx context.Context, w *countingWriter, r *http.Request, st *fwdState, u *h1client.Conn, k upstreamKey) (abort bool, err error) {
	// The guest going away (or a revocation closing its connection) ends
	// the exchange at once, whatever the origin is doing: through the
	// watch of the guest's HTTP/1 connection, else a watch of its own.
	var stop func() bool
	xw := h1.WatchOf(w.ResponseWriter)
	if xw == nil {
		stop = context.AfterFunc(ctx, u.CloseF)
	} else if !xw.Begin(&u.CloseF) {
		u.Close()
		return false, ctx.Err()
	}
	reuse := false
	defer func() {
		var untouched bool
		if xw != nil {
			untouched = xw.End(&u.CloseF)
		} else {
			untouched = stop()
		}
		if untouched && reuse {
			p.pool.Put(k, st.checked.Target, u)
		} else {
			u.Close()
		}
	}()

	out := p.outbound(r, st)
	var cut *atomic.Bool // the guest's flag that it cut its body
	if cb, ok := guestBody(out.Body); ok {
		cut = &cb.broken
	}
	up, err := u.Send(out, cut, p.panics, r.RemoteAddr)
	if err != nil {
		return false, err
	}
	resp, err := u.ReadResponse(ctx, out, up, cut, func(resp *http.Response) {
		// Informational answers (103 Early Hints) are passed on.
		h := w.Header()
		for k, vv := range resp.Header {
			h[k] = vv
		}
		w.ResponseWriter.WriteHeader(resp.StatusCode)
		clear(h)
	})
	if err != nil {
		return false, err
	}

	relayHeader(w, resp)
	var rerr, werr error
	if !u.TLS() && resp.ContentLength >= connio.BulkMin && out.Method != http.MethodHead {
		rerr, werr = relayRawBody(w, u, resp.ContentLength)
	} else if u.TLS() && resp.ContentLength >= connio.BulkMin {
		rerr, werr = relayBulk(w, resp, u)
	} else {
		rerr, werr = relayBody(w, resp)
	}
	if rerr != nil || werr != nil {
		st.rec.err = errors.Join(rerr, werr)
		return true, nil
	}
	relayTrailers(w, resp)
	// An upload not finished: the origin answered before it took the
	// whole body, so this connection is done; closing it ends the writer.
	reuse = up.Finished() && !resp.Close && !out.Close
	return false, nil
}

// exchangeH2 sends r over the shared HTTP/2 connection cc and copies the
// response to w; errors and abort as exchange's.
func (p *Proxy) exchangeH2(ctx context.Context, w *countingWriter, r *http.Request, st *fwdState, cc *http2.ClientConn) (abort bool, err error) {
	out := p.outbound(r, st).WithContext(ctx)
	resp, err := p.roundTripH2(ctx, out, st, cc)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return false, errors.New("reading upstream response: 101 Switching Protocols over HTTP/2")
	}
	relayHeader(w, resp)
	if rerr, werr := relayBody(w, resp); rerr != nil || werr != nil {
		st.rec.err = errors.Join(rerr, werr)
		return true, nil
	}
	relayTrailers(w, resp)
	return false, nil
}

// roundTripH2 sends out on cc. A request without a body whose connection
// went away under it (GOAWAY, a close while idle) goes once more on a new
// connection, as http.Transport would send it.
func (p *Proxy) roundTripH2(ctx context.Context, out *http.Request, st *fwdState, cc *http2.ClientConn) (*http.Response, error) {
	resp, err := cc.RoundTrip(out)
	if err == nil || h1client.H2Usable(cc) || ctx.Err() != nil || out.Body != nil {
		return resp, err
	}
	u, cc2, _, derr := p.dialUpstreamConn(ctx, st)
	if derr != nil {
		return nil, err
	}
	if cc2 == nil {
		u.Close() // the origin stopped offering HTTP/2; the guest may retry
		return nil, err
	}
	return cc2.RoundTrip(out)
}

// relayHeader gives the guest the origin's status and header, without the
// hop-by-hop fields, announcing its trailers.
func relayHeader(w *countingWriter, resp *http.Response) {
	h1.RemoveHopByHop(resp.Header)
	if !h1.AdoptHeader(w.ResponseWriter, resp.Header) {
		h := w.Header()
		for k, vv := range resp.Header {
			h[k] = vv
		}
	}
	h := w.Header()
	if len(resp.Trailer) > 0 {
		keys := make([]string, 0, len(resp.Trailer))
		for k := range resp.Trailer {
			keys = append(keys, k)
		}
		h["Trailer"] = []string{strings.Join(keys, ", ")}
	}
	w.WriteHeader(resp.StatusCode)
}

// relayBody streams the body through a pooled buffer; bodies of unknown
// length and event streams are flushed on every write (as ReverseProxy
// does), others are left to the server's buffering.
func relayBody(w *countingWriter, resp *http.Response) (rerr, werr error) {
	flush := resp.ContentLength == -1 || isEventStream(resp.Header)
	bp := connio.CopyBuf()
	defer connio.PutCopyBuf(bp)
	return copyBody(w, resp.Body, *bp, flush, nil)
}

// relayBulk streams a large body of known length from an upstream TLS
// connection: each write to the guest carries every record that had
// already arrived, up to a bulk buffer's size (connio), so the guest's own TLS layer
// writes them at once. It never waits for the network while it holds
// bytes not yet written.
func relayBulk(w *countingWriter, resp *http.Response, u *h1client.Conn) (rerr, werr error) {
	buf, release := connio.BulkOrCopyBuf()
	defer release()
	more := func() bool { return u.BR.Buffered() > 0 || u.RB.RecordReady() }
	return copyBody(w, resp.Body, buf, false, more)
}

// relayTrailers sets the trailers that arrived with the body.
func relayTrailers(w *countingWriter, resp *http.Response) {
	h := w.Header()
	for k, vv := range resp.Trailer {
		h[k] = vv
	}
}

// relayRawBody sends a plain-HTTP body of n bytes: what the header read
// buffered, then the rest straight from the upstream connection to the
// guest's, in large pieces when the guest's connection takes a connio.RawBody
// (connio.H1Guard.ReadFrom). The response's own body reader is bypassed; the
// connection ends exactly after the body.
func relayRawBody(w *countingWriter, u *h1client.Conn, n int64) (rerr, werr error) {
	if k := min(int64(u.BR.Buffered()), n); k > 0 {
		b, _ := u.BR.Peek(int(k))
		if _, err := w.Write(b); err != nil {
			return nil, err
		}
		u.BR.Discard(int(k))
		n -= k
	}
	rb := connio.NewRawBody(u.Raw, n)
	_, err := w.ReadFrom(rb)
	if err == nil && rb.Remaining() > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		// Which side failed is not told apart here; both end the exchange.
		return err, nil
	}
	return nil, nil
}

// copyBody streams the response body; rerr is the origin's failure, werr
// the guest's. When more is set, a read is followed by further reads into
// the rest of buf for as long as more reports bytes that can be read
// without waiting.
func copyBody(w *countingWriter, body io.Reader, buf []byte, flush bool, more func() bool) (rerr, werr error) {
	for {
		k, err := body.Read(buf)
		for err == nil && more != nil && k < len(buf) && more() {
			var m int
			m, err = body.Read(buf[k:])
			k += m
		}
		if k > 0 {
			if _, e := w.Write(buf[:k]); e != nil {
				return nil, e
			}
			if flush {
				w.Flush()
			}
		}
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return err, nil
		}
	}
}

func isEventStream(h http.Header) bool {
	v := h["Content-Type"]
	return len(v) > 0 && strings.HasPrefix(strings.ToLower(strings.TrimSpace(v[0])), "text/event-stream")
}

// outbound turns the guest's request into the one sent upstream: the
// checked authority, no hop-by-hop or proxy fields (those ReverseProxy
// removes too, including inbound X-Forwarded-*), and no default
// User-Agent where the guest sent none.
func (p *Proxy) outbound(r *http.Request, st *fwdState) *http.Request {
	t := st.checked.Target
	auth := t.Authority()
	u := &st.outURL
	upstreamURL(u, r.URL, st.scheme, auth)
	if st.ruled {
		st.target.SetURL(u) // the form the rules decided, byte for byte
	}
	h := r.Header
	keepTE := httpguts.HeaderValuesContainsToken(h["Te"], "trailers")
	h1.RemoveHopByHop(h)
	if keepTE {
		h["Te"] = []string{"trailers"}
	}
	removeRoutingFields(h)
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = []string{""}
	}
	out := &st.out
	*out = http.Request{
		Method:        r.Method,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Host:          hostHeader(t, auth, st.defaultPort),
		ContentLength: r.ContentLength,
	}
	if r.Body != nil && r.Body != http.NoBody {
		out.Body = r.Body
		if len(r.Trailer) > 0 {
			out.Trailer, out.Body = forwardTrailer(r)
		}
	}
	return out
}

// removeRoutingFields drops the fields by which a client names, to the
// servers behind the next hop, another host than the one it connects to:
// Forwarded (RFC 7239), every X-Forwarded-* and the host overrides
// frameworks and CDNs honour. The proxy decided the request's host; an
// origin that fronts many (a CDN, a reverse proxy trusting its peers)
// must not be told another one by the guest (TestRoutingFieldsDropped).
// Proxy goes too: CGI-style servers hand it to the application as
// HTTP_PROXY, the proxy of its own outgoing requests (httpoxy).
func removeRoutingFields(h http.Header) {
	for k := range h {
		if isRoutingField(k) {
			delete(h, k)
		}
	}
}

// forwardTrailer returns the trailer the upstream request declares, with
// only the fields r declared that a trailer may carry, and a body that
// fills it in from r's trailer once r's body is read (net/http merges the
// received trailer into r.Trailer before the body reports EOF, and writes
// the outgoing one after that). A field that routes, frames, authenticates
// or is hop-by-hop (Host, Content-Length, Authorization, Forwarded,
// Connection, ...; RFC 9110 6.5.1) must not be taken from a trailer, and an
// origin that merged it into the header would: it is never sent, nor is
// any field the guest sent without declaring it (TestTrailerFieldsFiltered).
func forwardTrailer(r *http.Request) (http.Header, io.ReadCloser) {
	var decl http.Header
	for k := range r.Trailer {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if !httpguts.ValidTrailerHeader(ck) || h1.IsHopHeader(ck) || isRoutingField(ck) {
			continue
		}
		if decl == nil {
			decl = make(http.Header, len(r.Trailer))
		}
		decl[ck] = nil
	}
	if decl == nil {
		return nil, r.Body
	}
	return decl, &trailerBody{ReadCloser: r.Body, from: r, to: decl}
}

// guestBody returns the guest's body under b (forwardTrailer may have
// wrapped it), whose broken flag says whether the guest cut it.
func guestBody(b io.ReadCloser) (*countingBody, bool) {
	if tb, ok := b.(*trailerBody); ok {
		b = tb.ReadCloser
	}
	cb, ok := b.(*countingBody)
	return cb, ok
}

// trailerBody copies the declared trailer fields of from into to when the
// body ends.
type trailerBody struct {
	io.ReadCloser
	from *http.Request
	to   http.Header
}

func (b *trailerBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		for k := range b.to {
			b.to[k] = b.from.Trailer[k]
		}
	}
	return n, err
}

// hostHeader is t.HostHeader(defaultPort) reusing its authority.
func hostHeader(t egress.Target, auth string, defaultPort uint16) string {
	if t.Port == defaultPort {
		return t.HostHeader(defaultPort)
	}
	return auth
}
