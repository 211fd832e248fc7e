package connio

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http/httpguts"
)

// H1Guard validates every HTTP/1.x request header block that crosses a
// connection before net/http parses it. net/http accepts obsolete line
// folding and Content-Length together with Transfer-Encoding (it drops the
// Content-Length); a filtering proxy refuses both, because two parsers that
// disagree on framing are what request smuggling is made of.
//
// The guard follows the message framing (Content-Length or chunked bodies)
// to find where the next request starts, and stops looking after a CONNECT
// or an Upgrade request, when the connection stops carrying HTTP/1.
type H1Guard struct {
	net.Conn
	maxHeader int

	wmu      sync.Mutex     // serialises Write with the guard's own refusal
	rejected bool           // guarded by wmu
	bulk     *atomic.Uint64 // counts bodies relayed by ReadFrom; never nil

	st       h1State
	line     []byte
	hdrBytes int
	first    bool
	method   []byte
	http10   bool // the request line names HTTP/1.0 (or older)
	clSeen   bool
	clVal    []byte
	teSeen   bool
	hostSeen bool // a Host field, valid (one at most: the parser refuses more)
	upgrade  bool
	remain   uint64 // body or chunk bytes still to skip
	onReject func(reason string)
	readErr  error // set once a request was refused (read side only)
}

type h1State int

const (
	stHeader h1State = iota
	stBody
	stChunkSize
	stChunkData
	stChunkEnd
	stTrailer
	stPass
)

// guardReject is a refusal with the status to answer.
type guardReject struct {
	status int
	reason string
}

// NewH1Guard guards c: a request header block larger than maxHeader, or
// any framing it refuses, is answered with its status and reason, the
// connection ends, and onReject (may be nil) is told the reason.
func NewH1Guard(c net.Conn, maxHeader int, onReject func(string)) *H1Guard {
	return &H1Guard{Conn: c, maxHeader: maxHeader, first: true, onReject: onReject, bulk: &noBulk}
}

// CountBulk makes n count the bodies relayed by ReadFrom.
func (g *H1Guard) CountBulk(n *atomic.Uint64) { g.bulk = n }

// Refused tells the guard's onReject of a refusal made above it (by the
// server loop), so every refusal of a connection is reported one way.
func (g *H1Guard) Refused(reason string) {
	if g.onReject != nil {
		g.onReject(reason)
	}
}

// noBulk counts for guards nobody asks (intercepted connections).
var noBulk atomic.Uint64

func (g *H1Guard) Read(p []byte) (int, error) {
	if g.readErr != nil {
		return 0, g.readErr
	}
	n, err := g.Conn.Read(p)
	if n > 0 && g.st != stPass {
		if rej := g.scan(p[:n]); rej != nil {
			g.refuse(rej)
			// An OpError with Op "read" makes the server drop the
			// connection silently: the guard has already answered. Every
			// later read fails the same way.
			g.readErr = &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("request refused: %s", rej.reason)}
			return 0, g.readErr
		}
	}
	return n, err
}

func (g *H1Guard) Write(p []byte) (int, error) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.rejected {
		return 0, net.ErrClosed
	}
	return g.Conn.Write(p)
}

func (g *H1Guard) refuse(r *guardReject) {
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.rejected {
		return
	}
	g.rejected = true
	body := fmt.Sprintf("abox proxy: malformed request refused: %s\n", r.reason)
	fmt.Fprintf(g.Conn, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nX-Abox-Reason: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		r.status, statusText(r.status), r.reason, len(body), body)
	if g.onReject != nil {
		g.onReject(r.reason)
	}
}

func statusText(code int) string {
	switch code {
	case 431:
		return "Request Header Fields Too Large"
	case 414:
		return "URI Too Long"
	case 501:
		return "Not Implemented"
	}
	return "Bad Request"
}

// Limits of one line: a chunk-size line, the request line (longer is 414)
// and one header field (longer is 431), besides the whole block's maxHeader.
const (
	maxChunkLine = 4096
	// MaxRequestLine is the longest request line (and target) accepted.
	MaxRequestLine = 8 << 10
	// MaxFieldLine is the longest header field accepted.
	MaxFieldLine = 16 << 10
)

func (g *H1Guard) scan(b []byte) *guardReject {
	for len(b) > 0 {
		switch g.st {
		case stPass:
			return nil
		case stBody, stChunkData:
			k := uint64(len(b))
			if k > g.remain {
				k = g.remain
			}
			b = b[k:]
			g.remain -= k
			if g.remain == 0 {
				if g.st == stBody {
					g.reset()
				} else {
					g.st = stChunkEnd
				}
			}
		default:
			i := bytes.IndexByte(b, '\n')
			chunk := b
			if i >= 0 {
				chunk = b[:i]
			}
			n := len(g.line) + len(chunk)
			switch {
			case g.st != stHeader:
				if n > maxChunkLine {
					return &guardReject{400, "invalid_chunk"}
				}
			case g.first && n > MaxRequestLine:
				return &guardReject{414, ReasonURITooLong}
			case g.hdrBytes+n > g.maxHeader:
				return &guardReject{431, "headers_too_large"}
			case !g.first && n > MaxFieldLine:
				return &guardReject{431, ReasonFieldTooLarge}
			}
			g.line = append(g.line, chunk...)
			if i < 0 {
				return nil
			}
			b = b[i+1:]
			line := g.line
			g.line = g.line[:0]
			if rej := g.endLine(line); rej != nil {
				return rej
			}
		}
	}
	return nil
}

func (g *H1Guard) reset() {
	g.st, g.first, g.hdrBytes = stHeader, true, 0
	g.method, g.http10, g.clSeen, g.clVal, g.teSeen, g.upgrade = g.method[:0], false, false, g.clVal[:0], false, false
	g.hostSeen = false
}

// endLine handles one complete line (without its LF).
func (g *H1Guard) endLine(line []byte) *guardReject {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if bytes.IndexByte(line, '\r') >= 0 {
		return &guardReject{400, "bare_cr"}
	}
	switch g.st {
	case stHeader:
		g.hdrBytes += len(line) + 2
		if g.first {
			if len(line) == 0 {
				return nil // stray CRLF between requests (RFC 9112 2.2)
			}
			g.first = false
			m, _, _ := bytes.Cut(line, []byte(" "))
			g.method = append(g.method[:0], m...)
			g.http10 = !bytes.HasSuffix(line, []byte(" HTTP/1.1"))
			return nil
		}
		if len(line) == 0 {
			return g.endHeaders()
		}
		return g.headerLine(line)
	case stChunkSize:
		sz := line
		if i := bytes.IndexByte(sz, ';'); i >= 0 {
			sz = sz[:i]
		}
		sz = bytes.TrimRight(sz, " \t")
		if len(sz) == 0 || len(sz) > 15 {
			return &guardReject{400, "invalid_chunk"}
		}
		n, err := strconv.ParseUint(string(sz), 16, 64)
		if err != nil {
			return &guardReject{400, "invalid_chunk"}
		}
		if n == 0 {
			g.st = stTrailer
			return nil
		}
		g.st, g.remain = stChunkData, n
	case stChunkEnd:
		if len(line) != 0 {
			return &guardReject{400, "invalid_chunk"}
		}
		g.st = stChunkSize
	case stTrailer:
		if len(line) == 0 {
			g.reset()
			return nil
		}
		if line[0] == ' ' || line[0] == '\t' {
			return &guardReject{400, "obs_fold"}
		}
	}
	return nil
}

func (g *H1Guard) headerLine(line []byte) *guardReject {
	if line[0] == ' ' || line[0] == '\t' {
		return &guardReject{400, "obs_fold"}
	}
	name, val, ok := bytes.Cut(line, []byte(":"))
	if !ok || len(name) == 0 {
		return &guardReject{400, "invalid_header"}
	}
	for _, c := range name {
		if c <= ' ' || c >= 0x7f {
			return &guardReject{400, "invalid_header"}
		}
	}
	val = bytes.Trim(val, " \t")
	switch {
	case bytes.EqualFold(name, []byte("Content-Length")):
		if len(val) == 0 || len(val) > 18 {
			return &guardReject{400, "invalid_content_length"}
		}
		for _, c := range val {
			if c < '0' || c > '9' {
				return &guardReject{400, "invalid_content_length"}
			}
		}
		if g.clSeen && !bytes.Equal(val, g.clVal) {
			return &guardReject{400, "conflicting_content_length"}
		}
		g.clSeen, g.clVal = true, append(g.clVal[:0], val...)
	case bytes.EqualFold(name, []byte("Transfer-Encoding")):
		if g.teSeen || !bytes.EqualFold(val, []byte("chunked")) {
			return &guardReject{501, "unsupported_transfer_encoding"}
		}
		g.teSeen = true
	case bytes.EqualFold(name, []byte("Upgrade")):
		g.upgrade = true
	case bytes.EqualFold(name, []byte("Host")):
		// http.ReadRequest drops the Host field of an absolute-form
		// request, so the server loop cannot check it as net/http's
		// server did (RFC 9112 3.2: 400 for an invalid one).
		if !httpguts.ValidHostHeader(string(val)) {
			return &guardReject{400, ReasonMalformedHost}
		}
		g.hostSeen = true
	}
	return nil
}

func (g *H1Guard) endHeaders() *guardReject {
	if g.clSeen && g.teSeen {
		return &guardReject{400, "content_length_with_transfer_encoding"}
	}
	// net/http ignores Transfer-Encoding below HTTP/1.1 and would read the
	// chunks as the next request; RFC 9112 6.1 calls such framing faulty.
	if g.teSeen && g.http10 {
		return &guardReject{400, "transfer_encoding_in_http10"}
	}
	// RFC 9112 3.2: an HTTP/1.1 request without Host is a 400, whatever
	// its target's form (an h2c preface is not HTTP/1).
	if !g.hostSeen && !g.http10 && !bytes.Equal(g.method, []byte("CONNECT")) && !bytes.Equal(g.method, []byte("PRI")) {
		return &guardReject{400, ReasonMissingHost}
	}
	switch {
	case bytes.Equal(g.method, []byte("CONNECT")) || g.upgrade:
		g.st = stPass
	case g.teSeen:
		g.st = stChunkSize
	case g.clSeen:
		n, _ := strconv.ParseUint(string(g.clVal), 10, 64)
		if n == 0 {
			g.reset()
			return nil
		}
		g.st, g.remain = stBody, n
	default:
		g.reset()
	}
	return nil
}
