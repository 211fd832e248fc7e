package h1

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// The guest-side HTTP/1.x server: one loop per connection (plain proxy
// connections and intercepted inner connections alike) that reads requests
// with http.ReadRequest from a pooled bufio.Reader over the h1 guard, runs
// the proxy's handler, and writes each response into a per-connection
// buffer flushed once at its end (or when the handler flushes). It does
// what net/http's server did for these handlers, without its per-request
// context, background reader and deadline changes:
//
//   - the checks net/http applies after parsing (HTTP/1.x only, one valid
//     Host on HTTP/1.1, valid field names and values);
//   - Expect: 100-continue (answered on the first read of the body; any
//     other expectation is 417);
//   - response framing: the handler's Content-Length, else chunked for
//     HTTP/1.1 and close for HTTP/1.0, a computed Content-Length for a
//     short answer, no body for HEAD, 1xx, 204 and 304, trailers, Date;
//   - keep-alive: HTTP/1.0 keep-alive, Connection: close from either side,
//     an answer shorter than its Content-Length or a request body left
//     unread past MaxDrain closes the connection;
//   - Hijack (CONNECT, WebSocket) and http.ErrAbortHandler.
//
// The h1 guard has already refused malformed framing before the parser
// sees it; a request that still fails to parse is a 400 and the end of the
// connection.

const (
	h1ReadBuf  = 4 << 10
	h1WriteBuf = 4 << 10
	// MaxDrain is how much of a request body the handler left unread is
	// read and discarded to keep the connection; more closes it.
	MaxDrain = 256 << 10
	// pendingMax is how much of an answer of unknown length is held back
	// before its header is sent, so that a short one gets a Content-Length.
	pendingMax = 2 << 10
)

var (
	h1Readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, h1ReadBuf) }}
	h1Writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, h1WriteBuf) }}
)

// h1Conn is one guest connection served by Serve.
type h1Conn struct {
	s       *Server
	c       net.Conn // the h1 guard
	br      *bufio.Reader
	bw      *bufio.Writer
	ctx     context.Context
	remote  string
	handler Handler
	idle    atomic.Bool // waiting for a request: shutdown closes it
	hdr     HeaderClock
	w       h1Response // reused by every request
	body    *h1Body    // the current request's body, nil without one
	watch   Watch
}

// Serve serves HTTP/1.x requests on c (the guest's connection, under its
// connio.H1Guard) with h until either side ends the connection; c is
// closed on return unless a handler hijacked it.
func (s *Server) Serve(ctx context.Context, c net.Conn, h Handler) {
	hc := &h1Conn{s: s, c: c, ctx: ctx, remote: c.RemoteAddr().String(), handler: h}
	hc.br = h1Readers.Get().(*bufio.Reader)
	hc.br.Reset(c)
	hc.bw = h1Writers.Get().(*bufio.Writer)
	hc.bw.Reset(c)
	hc.w.hc = hc
	hc.w.header = make(http.Header)
	if !s.add(hc) {
		c.Close()
		return
	}
	hc.hdr.Start(c, s.HeaderTimeout)
	stopWatch := context.AfterFunc(ctx, hc.watch.fire)
	hijacked := false
	defer func() {
		stopWatch()
		hc.hdr.Stop()
		s.remove(hc)
		if hijacked {
			return // the handler owns c, br and bw now
		}
		hc.w.stopContinue()
		hc.bw.Flush()
		c.Close()
		// A body reader still running (an upload the origin did not wait
		// for) is unblocked by the close and must not read the buffer
		// once another connection has it.
		if b := hc.body; b != nil {
			b.mu.Lock()
			b.detached = true
			b.mu.Unlock()
		}
		hc.br.Reset(nil)
		hc.bw.Reset(nil)
		h1Readers.Put(hc.br)
		h1Writers.Put(hc.bw)
	}()
	for first := true; ; first = false {
		if !first {
			hc.idle.Store(true)
			if s.closing.Load() {
				return
			}
			_, err := hc.br.Peek(1)
			hc.idle.Store(false)
			if err != nil {
				return
			}
		}
		hc.hdr.Begin()
		req, err := hc.readRequest()
		hc.hdr.End()
		if err != nil {
			hc.badRequest(err)
			return
		}
		keep := hc.serve(req)
		if hc.w.hijacked {
			hijacked = true
			return
		}
		if !keep {
			return
		}
	}
}

// readRequest reads the next request, dropping CR and LF before its
// request line (RFC 9112 2.2), as the h1 guard does.
func (hc *h1Conn) readRequest() (*http.Request, error) {
	for {
		b, err := hc.br.Peek(1)
		if err != nil {
			return nil, err
		}
		if b[0] != '\r' && b[0] != '\n' {
			return http.ReadRequest(hc.br)
		}
		hc.br.Discard(1)
	}
}

// badRequest answers a request that could not be read: nothing for a
// connection that ended or was refused by the guard (it has answered and
// logged), 501 for an unknown transfer coding, else 400 malformed_request.
func (hc *h1Conn) badRequest(err error) {
	if err == io.EOF {
		return
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return
	}
	if oe, ok := err.(*net.OpError); ok && oe.Op == "read" {
		return
	}
	if strings.Contains(err.Error(), "unsupported transfer encoding") {
		hc.refuse(http.StatusNotImplemented, "unsupported_transfer_encoding", "Unsupported transfer encoding")
		return
	}
	hc.refuse(http.StatusBadRequest, ReasonMalformedRequest, "400 Bad Request")
}

// refuse answers a request the loop itself turns away before any handler
// sees it (it cannot be parsed, or breaks a rule net/http's server
// applies), with its reason in X-Abox-Reason, ends the connection and logs
// the decision line as the guard's refusals are.
func (hc *h1Conn) refuse(status int, reason, msg string) {
	io.WriteString(hc.c, "HTTP/1.1 "+strconv.Itoa(status)+" "+http.StatusText(status)+
		"\r\nContent-Type: text/plain; charset=utf-8\r\nX-Abox-Reason: "+reason+"\r\nConnection: close\r\n\r\n"+msg)
	if g, ok := hc.c.(*connio.H1Guard); ok {
		g.Refused(reason)
	}
}

// serve runs the handler for req and reports whether the connection can
// carry another request.
func (hc *h1Conn) serve(req *http.Request) (keep bool) {
	if req.ProtoMajor != 1 {
		hc.refuse(http.StatusHTTPVersionNotSupported, ReasonHTTPVersion, "505 HTTP Version Not Supported: unsupported protocol version")
		return false
	}
	if reason, msg := invalidRequest(req); reason != "" {
		hc.refuse(http.StatusBadRequest, reason, "400 Bad Request: "+msg)
		return false
	}
	req.RemoteAddr = hc.remote

	w := &hc.w
	w.reset(req)
	hc.body = nil
	if req.Body != nil && req.Body != http.NoBody {
		hc.body = &h1Body{rc: req.Body, w: w}
		req.Body = hc.body
		w.body = hc.body
	}
	if exp := req.Header["Expect"]; len(exp) > 0 {
		if !httpguts.HeaderValuesContainsToken(exp[:1], "100-continue") {
			hc.refuse(http.StatusExpectationFailed, ReasonExpectation, "417 Expectation Failed: only 100-continue is supported")
			return false
		}
		if req.ProtoAtLeast(1, 1) && req.ContentLength != 0 && hc.body != nil {
			w.expect = true
			w.canContinue.Store(true)
		}
	}
	if !hc.run(w, req) {
		// http.ErrAbortHandler (or a panic): what was written goes out
		// and the connection ends, so the answer is visibly cut.
		return false
	}
	if w.hijacked {
		return false
	}
	return w.finish()
}

// run calls the handler; false means it panicked.
func (hc *h1Conn) run(w *h1Response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				hc.s.Panics.Report("http request", v, "client", hc.remote)
			}
			ok = false
		}
	}()
	hc.handler(hc.ctx, w, req)
	return true
}

// invalidRequest applies the checks net/http's server makes after parsing
// and names the one that failed (reason code, message).
// http.ReadRequest has moved the Host field into req.Host (the target's
// authority wins for absolute-form, as RFC 9112 3.2.2 says), so an HTTP/1.1
// request without either is the one refused for a missing Host.
func invalidRequest(req *http.Request) (reason, msg string) {
	if req.Host == "" && req.ProtoAtLeast(1, 1) && req.Method != http.MethodConnect &&
		!(req.Method == "PRI" && req.RequestURI == "*") {
		return ReasonMissingHost, "missing required Host header"
	}
	if req.Host != "" && !httpguts.ValidHostHeader(req.Host) {
		return ReasonMalformedHost, "malformed Host header"
	}
	for k, vv := range req.Header {
		if !httpguts.ValidHeaderFieldName(k) {
			return "invalid_header", "invalid header name"
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return "invalid_header", "invalid header value"
			}
		}
	}
	return "", ""
}

// h1Body is a request body as the handler sees it. Close does not read
// the rest (the server decides after the handler whether to drain it or
// close the connection), and the first read answers 100-continue.
type h1Body struct {
	w        *h1Response
	rc       io.ReadCloser
	mu       sync.Mutex  // the handler's body writer may read while the server drains
	sawEOF   atomic.Bool // read without mu when the answer starts
	closed   bool
	detached bool // the request is over: the bytes that follow are not its
}

func (b *h1Body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.detached {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.w.canContinue.Load() {
		b.w.writeContinue()
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.sawEOF.Store(true)
	}
	return n, err
}

func (b *h1Body) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}

// drain reads what the handler left of the body, up to MaxDrain, and
// reports whether the next request starts right after it. Any later read
// through the body fails.
func (b *h1Body) drain() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	defer func() { b.detached = true }()
	switch {
	case b.sawEOF.Load():
		return true
	case b.closed || b.detached:
		return false // closed early: where it ends is not known
	}
	_, err := io.CopyN(io.Discard, b.rc, MaxDrain+1)
	return err == io.EOF
}
