package h1

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// h1Response is the http.ResponseWriter of Server.Serve (also a Flusher,
// Hijacker and ReaderFrom).
type h1Response struct {
	hc     *h1Conn
	req    *http.Request
	header http.Header
	body   *h1Body

	wantsClose bool // Connection: close, or HTTP/1.0 without keep-alive
	wants10KA  bool // HTTP/1.0 with Connection: keep-alive
	expect     bool // 100-continue was asked for a body

	status      int
	wroteHeader bool // a final status was set
	committed   bool // its header is in the write buffer
	handlerDone bool
	hijacked    bool
	is11        bool
	isHEAD      bool
	noBody      bool // HEAD, 1xx, 204, 304: nothing after the header
	chunked     bool
	closeAfter  bool
	cl          int64 // -1: not known
	written     int64
	pending     []byte // an answer of unknown length held back (up to pendingMax)
	trailers    []string
	werr        error

	canContinue atomic.Bool
	continueMu  sync.Mutex // the body reader writes 100 Continue from its goroutine
	scratch     [32]byte
}

// reset readies w for req (the same h1Response serves every request of a
// connection).
func (w *h1Response) reset(req *http.Request) {
	clear(w.header)
	w.req, w.body = req, nil
	w.status, w.wroteHeader, w.committed, w.handlerDone, w.hijacked = 0, false, false, false, false
	w.noBody, w.chunked, w.expect = false, false, false
	w.cl, w.written, w.werr = -1, 0, nil
	w.pending, w.trailers = w.pending[:0], w.trailers[:0]
	w.canContinue.Store(false)
	w.is11 = req.ProtoAtLeast(1, 1)
	w.isHEAD = req.Method == http.MethodHead
	conn := req.Header["Connection"]
	w.wantsClose = req.Close || httpguts.HeaderValuesContainsToken(conn, "close")
	w.wants10KA = req.ProtoMajor == 1 && req.ProtoMinor == 0 && httpguts.HeaderValuesContainsToken(conn, "keep-alive")
	w.closeAfter = req.Method == "PRI" // an h2c preface: nothing HTTP/1 follows
}

func (w *h1Response) Header() http.Header { return w.header }

// adoptHeader makes h the answer's header (an origin's, relayed as it is)
// instead of copying it field by field: only while nothing else was set.
// The map is the connection's from then on, cleared for the next answer.
func (w *h1Response) adoptHeader(h http.Header) bool {
	if w.wroteHeader || w.hijacked || len(w.header) > 0 {
		return false
	}
	w.header = h
	return true
}

// AdoptHeader makes h (an origin's header, relayed as it is) the header of
// the answer w is writing instead of copying it field by field, when w is
// the server loop's and nothing of its answer is set yet; it reports
// whether it did. The map is w's from then on (w.Header() returns it).
func AdoptHeader(w http.ResponseWriter, h http.Header) bool {
	hw, ok := w.(*h1Response)
	return ok && hw.adoptHeader(h)
}

// writeContinue answers 100-continue, unless the answer has started.
func (w *h1Response) writeContinue() {
	w.continueMu.Lock()
	defer w.continueMu.Unlock()
	if !w.canContinue.Load() {
		return
	}
	w.canContinue.Store(false)
	bw := w.hc.bw
	bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	if err := bw.Flush(); err != nil {
		w.werr = err
	}
}

// stopContinue: once the answer starts, the body reader writes nothing.
func (w *h1Response) stopContinue() {
	if w.canContinue.Load() {
		w.continueMu.Lock()
		w.canContinue.Store(false)
		w.continueMu.Unlock()
	}
}

func (w *h1Response) WriteHeader(code int) {
	if w.hijacked || w.wroteHeader {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		w.writeInformational(code)
		return
	}
	w.stopContinue()
	w.wroteHeader, w.status = true, code
	if v := w.header.Get("Content-Length"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil && n >= 0 {
			w.cl = n
		} else {
			delete(w.header, "Content-Length")
		}
	}
	w.noBody = w.isHEAD || !bodyAllowed(code)
	if w.cl >= 0 || w.noBody {
		w.commit()
	}
}

// writeInformational sends a 1xx answer (103 Early Hints, a 100 the
// handler sends itself) at once; HTTP/1.0 clients get none.
func (w *h1Response) writeInformational(code int) {
	if code == http.StatusContinue {
		w.stopContinue()
	}
	if !w.is11 {
		return
	}
	w.continueMu.Lock()
	defer w.continueMu.Unlock()
	bw := w.hc.bw
	w.statusLine(code)
	writeFields(bw, w.header, noBodyFields)
	bw.WriteString("\r\n")
	if err := bw.Flush(); err != nil {
		w.werr = err
	}
}

func (w *h1Response) statusLine(code int) {
	bw := w.hc.bw
	if w.is11 {
		bw.WriteString("HTTP/1.1 ")
	} else {
		bw.WriteString("HTTP/1.0 ")
	}
	bw.Write(strconv.AppendInt(w.scratch[:0], int64(code), 10))
	bw.WriteByte(' ')
	if text := http.StatusText(code); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.Write(strconv.AppendInt(w.scratch[:0], int64(code), 10))
	}
	bw.WriteString("\r\n")
}

func bodyAllowed(code int) bool {
	return !(code >= 100 && code <= 199 || code == http.StatusNoContent || code == http.StatusNotModified)
}

// commit decides the framing and puts the header in the write buffer.
func (w *h1Response) commit() {
	if w.committed {
		return
	}
	w.committed = true
	h := w.header
	for _, v := range h["Trailer"] {
		for _, k := range strings.Split(v, ",") {
			if k = textproto.TrimString(k); k != "" {
				w.trailers = append(w.trailers, http.CanonicalHeaderKey(k))
			}
		}
	}
	delete(h, "Transfer-Encoding") // the framing is the server's
	if w.handlerDone && len(w.trailers) == 0 && !w.noBody && w.cl < 0 {
		w.cl = int64(len(w.pending))
		h["Content-Length"] = []string{strconv.Itoa(len(w.pending))}
	}
	if !bodyAllowed(w.status) {
		delete(h, "Content-Length")
		if w.status == http.StatusNotModified {
			delete(h, "Content-Type")
		}
	}
	if w.wants10KA && (w.isHEAD || w.cl >= 0 || !bodyAllowed(w.status)) {
		if _, ok := h["Connection"]; !ok {
			h["Connection"] = []string{"keep-alive"}
		}
	} else if !w.is11 || w.wantsClose {
		w.closeAfter = true
	}
	if httpguts.HeaderValuesContainsToken(h["Connection"], "close") || w.hc.s.closing.Load() {
		w.closeAfter = true
	}
	if w.expect && !w.body.sawEOF.Load() {
		// 100-continue asked and the body not read to its end: the guest
		// may never send it, so where the next request starts is unknown.
		w.closeAfter = true
	}
	switch {
	case w.noBody:
	case w.cl >= 0:
	case w.is11:
		w.chunked = true
		delete(h, "Content-Length")
	default:
		w.closeAfter = true
	}
	if w.closeAfter && !httpguts.HeaderValuesContainsToken(h["Connection"], "close") {
		delete(h, "Connection")
		if w.is11 {
			h["Connection"] = []string{"close"}
		}
	}
	if _, ok := h["Date"]; !ok {
		h["Date"] = []string{httpDate()}
	}
	bw := w.hc.bw
	w.statusLine(w.status)
	writeFields(bw, h, nil)
	if w.chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	bw.WriteString("\r\n")
}

// noBodyFields are left out of a 1xx answer's header.
var noBodyFields = map[string]bool{"Content-Length": true, "Transfer-Encoding": true}

// writeFields writes a header block but the names in skip, dropping
// invalid names and folding any CR or LF in a value into a space, as
// net/http does.
func writeFields(bw *bufio.Writer, h http.Header, skip map[string]bool) {
	for k, vv := range h {
		if skip[k] {
			continue
		}
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(textproto.TrimString(v))
			bw.WriteString("\r\n")
		}
	}
}

func (w *h1Response) Write(b []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	w.stopContinue()
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(b) == 0 {
		return 0, nil
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(b))
	if w.cl >= 0 && w.written > w.cl {
		return 0, http.ErrContentLength
	}
	if !w.committed {
		if len(w.pending)+len(b) <= pendingMax {
			w.pending = append(w.pending, b...)
			return len(b), nil
		}
		w.commit()
		w.writeBody(w.pending)
		w.pending = w.pending[:0]
	}
	w.writeBody(b)
	if w.werr != nil {
		return 0, w.werr
	}
	return len(b), nil
}

func (w *h1Response) writeBody(b []byte) {
	if len(b) == 0 || w.isHEAD || w.werr != nil {
		return
	}
	bw := w.hc.bw
	if w.chunked {
		bw.Write(strconv.AppendInt(w.scratch[:0], int64(len(b)), 16))
		bw.WriteString("\r\n")
	}
	if _, err := bw.Write(b); err != nil {
		w.werr = err
		return
	}
	if w.chunked {
		bw.WriteString("\r\n")
	}
}

// Flush sends the header and what was written so far.
func (w *h1Response) Flush() { w.FlushError() }

func (w *h1Response) FlushError() error {
	if w.hijacked {
		return http.ErrHijacked
	}
	w.startBody()
	if w.werr == nil {
		w.werr = w.hc.bw.Flush()
	}
	return w.werr
}

// startBody puts the header (200 if none was set) and what was held back
// of the body in the write buffer.
func (w *h1Response) startBody() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit()
		w.writeBody(w.pending)
		w.pending = w.pending[:0]
	}
}

// ReadFrom sends a body of known length through the guest connection's
// own ReadFrom (the h1 guard moves a connio.RawBody through a large buffer); any
// other body is copied through Write.
func (w *h1Response) ReadFrom(src io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	sb, ok := src.(*connio.RawBody)
	rf, rfOK := w.hc.c.(io.ReaderFrom)
	if !ok || !rfOK || !w.committed || w.chunked || w.noBody || w.cl < 0 || w.written+sb.Remaining() > w.cl || w.hijacked {
		return connio.CopyVia(struct{ io.Writer }{w}, src)
	}
	if err := w.FlushError(); err != nil {
		return 0, err
	}
	n, err := rf.ReadFrom(sb)
	w.written += n
	if err != nil {
		w.werr = err
	}
	return n, err
}

// Hijack hands the connection to the handler (CONNECT, WebSocket): the
// server stops serving it and no longer waits for it at shutdown.
func (w *h1Response) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.hijacked {
		return nil, nil, http.ErrHijacked
	}
	hc := w.hc
	if w.committed {
		if err := hc.bw.Flush(); err != nil {
			return nil, nil, err
		}
	}
	w.hijacked = true
	hc.s.remove(hc)
	return hc.c, bufio.NewReadWriter(hc.br, hc.bw), nil
}

// finish completes the answer after the handler returned and reports
// whether the connection can carry another request.
func (w *h1Response) finish() bool {
	w.handlerDone = true
	w.startBody()
	bw := w.hc.bw
	if w.chunked && w.werr == nil {
		bw.WriteString("0\r\n")
		for _, k := range w.trailers {
			for _, v := range w.header[k] {
				if strings.ContainsAny(v, "\r\n") || !httpguts.ValidHeaderFieldName(k) {
					continue
				}
				bw.WriteString(k)
				bw.WriteString(": ")
				bw.WriteString(textproto.TrimString(v))
				bw.WriteString("\r\n")
			}
		}
		bw.WriteString("\r\n")
	}
	keep := !w.closeAfter
	if !w.noBody && w.cl >= 0 && w.written != w.cl {
		keep = false // the answer is short: the guest must see it cut
	}
	if keep && w.body != nil && !w.body.drain() {
		keep = false
	}
	if w.werr == nil {
		w.werr = bw.Flush()
	}
	return keep && w.werr == nil
}
