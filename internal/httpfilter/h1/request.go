package h1

import (
	"bufio"
	"net/http"
	"net/textproto"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// The client side's HTTP/1 framing: what the proxy writes to an origin.

// hopHeaders are the hop-by-hop fields (RFC 9110 7.6.1) and the proxy's own,
// removed in both directions together with every name listed in Connection.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// RemoveHopByHop deletes from h the hop-by-hop fields and every name its
// Connection field lists.
func RemoveHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for _, tok := range strings.Split(v, ",") {
			if tok = textproto.TrimString(tok); tok != "" {
				delete(h, textproto.CanonicalMIMEHeaderKey(tok))
			}
		}
	}
	if len(h) > len(hopHeaders) {
		for _, k := range hopHeaders {
			delete(h, k)
		}
		return
	}
	// A small header (the usual one) is cheaper to walk than to probe
	// for every hop-by-hop name.
	for k := range h {
		if IsHopHeader(k) {
			delete(h, k)
		}
	}
}

// IsHopHeader reports whether k is one of hopHeaders.
func IsHopHeader(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// WriteRequest writes out (without a body) on bw as out.Write does. A GET
// or HEAD with a plain ASCII host, the common case, is written here without
// Request.Write's allocations: the request line with URL.RequestURI(), Host,
// User-Agent (none when empty), then the other fields as writeFields
// writes them (no Content-Length: a GET or HEAD without a body has none).
// Anything else goes through Request.Write.
func WriteRequest(bw *bufio.Writer, out *http.Request) error {
	host := out.Host
	if out.Body != nil || out.Close || len(out.Trailer) > 0 ||
		(out.Method != http.MethodGet && out.Method != http.MethodHead) ||
		!plainHost(host) || !httpguts.ValidHostHeader(host) {
		return out.Write(bw)
	}
	ruri := out.URL.RequestURI()
	for i := 0; i < len(ruri); i++ {
		if ruri[i] < ' ' || ruri[i] == 0x7f {
			return out.Write(bw) // and its error
		}
	}
	bw.WriteString(out.Method)
	bw.WriteByte(' ')
	bw.WriteString(ruri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")
	ua := "Go-http-client/1.1"
	if vs, ok := out.Header["User-Agent"]; ok {
		ua = ""
		if len(vs) > 0 {
			ua = vs[0]
		}
	}
	if ua != "" {
		if strings.ContainsAny(ua, "\r\n") {
			ua = strings.NewReplacer("\r", " ", "\n", " ").Replace(ua)
		}
		bw.WriteString("User-Agent: ")
		bw.WriteString(textproto.TrimString(ua))
		bw.WriteString("\r\n")
	}
	writeFields(bw, out.Header, requestOwnFields)
	_, err := bw.WriteString("\r\n")
	return err
}

// requestOwnFields are written by WriteRequest itself, or not at all.
var requestOwnFields = map[string]bool{"Host": true, "User-Agent": true, "Content-Length": true, "Transfer-Encoding": true, "Trailer": true}

// plainHost: ASCII without a zone (Request.Write would convert or strip).
func plainHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 || h[i] == '%' {
			return false
		}
	}
	return h != ""
}
