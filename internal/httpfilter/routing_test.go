package httpfilter

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"
)

// routingFieldsSent are what the guest sends in TestRoutingFieldsDropped:
// a list of its own (not the proxy's table), so that a name dropped from
// the table fails the test.
var routingFieldsSent = []string{
	"Forwarded", "X-Forwarded", "X-Forwarded-Host", "X-Forwarded-Server", "X-Forwarded-For",
	"X-Forwarded-Proto", "X-Forwarded-Port", "X-Forwarded-Prefix", "X-Forwarded-Uri", "X-Host", "X-Original-Host",
	"X-Http-Host-Override", "X-Real-Host", "Disguised-Host", "Proxy", "X_Forwarded_Host", "X_Host", "x_forwarded-for",
	"X-Original-URL", "X-Rewrite-URL", "X-Original-URI", "X-Override-URL", "X-WAWS-Unencoded-URL", "x-envoy-original-path",
	"X-Envoy-Original-Dst-Host", "X-Url-Scheme", "X-Scheme", "Front-End-Https", "X-ARR-SSL",
	"X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override", "X_HTTP_Method_Override",
	"X-Real-IP", "X-Client-IP", "True-Client-IP", "CF-Connecting-IP", "Fastly-Client-IP", "X-Cluster-Client-IP",
	"X-Original-Forwarded-For", "Client-IP", "X-CF-App-Instance", "X-CF-Forwarded-Url", "Fly-Force-Instance-Id", "Fly-Prefer-Region",
}

// TestRoutingFieldSources: every field and family the proxy drops names
// the documentation it comes from.
func TestRoutingFieldSources(t *testing.T) {
	for k, src := range routingFields {
		if k != textproto.CanonicalMIMEHeaderKey(k) || strings.TrimSpace(src) == "" {
			t.Errorf("routing field %q (source %q): want a canonical name and its source", k, src)
		}
	}
	for _, p := range routingPrefixes {
		if strings.TrimSpace(p.source) == "" || !strings.HasSuffix(p.prefix, "-") {
			t.Errorf("routing prefix %q (source %q)", p.prefix, p.source)
		}
	}
	for _, k := range []string{"Accept", "Authorization", "Content-Type", "X-Request-Id", "User-Agent", "Cookie", "X-Forwardedfor"} {
		if isRoutingField(textproto.CanonicalMIMEHeaderKey(k)) {
			t.Errorf("%s counted as a routing field", k)
		}
	}
}

// TestRoutingFieldsDropped: Forwarded, X-Forwarded-*, the host overrides
// that frameworks and CDNs honour and Proxy (httpoxy), also spelled with
// underscores, never reach the origin, over
// plain HTTP, intercepted HTTP/1.1 and HTTP/2, and on a WebSocket upgrade
// (which ReverseProxy carries); an ordinary field does.
func TestRoutingFieldsDropped(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	so := newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, tt := range []struct {
		name, url string
		h2, ws    bool
	}{
		{"plain", "http://origin.test:" + port(t, o) + "/", false, false},
		{"plain upgrade", "http://origin.test:" + port(t, o) + "/", false, true},
		{"intercepted h1", "https://origin.test:" + port(t, so) + "/", false, false},
		{"intercepted h2", "https://origin.test:" + port(t, so) + "/", true, false},
		{"intercepted upgrade", "https://origin.test:" + port(t, so) + "/", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", tt.url, nil)
			for _, k := range routingFieldsSent {
				req.Header.Set(k, "host=evil.test")
			}
			req.Header.Set("X-End-To-End", "kept")
			if tt.ws {
				req.Header.Set("Connection", "Upgrade")
				req.Header.Set("Upgrade", "websocket")
			}
			resp, e, body := getJSON(t, h.client(tt.h2), req)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			for _, k := range routingFieldsSent {
				if v, ok := e.Header[textproto.CanonicalMIMEHeaderKey(k)]; ok {
					t.Errorf("origin received %s: %q", k, v)
				}
			}
			if e.Header.Get("X-End-To-End") != "kept" {
				t.Errorf("end-to-end field lost: %v", e.Header)
			}
		})
	}
}

// trailerMux reports the request trailer the origin read.
func trailerMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		got := http.Header{}
		for k, v := range r.Trailer {
			if v != nil {
				got[k] = v
			}
		}
		json.NewEncoder(w).Encode(got)
	})
	return mux
}

// TestTrailerFieldsFiltered: of a request's trailer, only fields a
// trailer may carry and the guest declared reach the origin: Host,
// Authorization, Forwarded, X-Forwarded-Host and an undeclared field do
// not, a checksum does.
func TestTrailerFieldsFiltered(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, trailerMux())
	so := newHTTPSOrigin(t, trailerMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	want := http.Header{"X-Checksum": {"c0ffee"}}
	check := func(t *testing.T, status int, body string) {
		t.Helper()
		var got http.Header
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil {
			t.Fatalf("status %d: %s", status, body)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("origin read trailer %v, want %v", got, want)
		}
	}
	t.Run("raw plain", func(t *testing.T) {
		resp, body := h.rawRequest(t, "POST http://origin.test:"+port(t, o)+"/ HTTP/1.1\r\nHost: origin.test\r\n"+
			"Trailer: Host, Authorization, Forwarded, X-Forwarded-Host, X-Checksum\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"+
			"5\r\nhello\r\n0\r\nHost: evil.test\r\nAuthorization: Basic eDp5\r\nForwarded: host=evil.test\r\nX-Forwarded-Host: evil.test\r\n"+
			"X-Checksum: c0ffee\r\nX-Undeclared: 1\r\n\r\n")
		check(t, resp.StatusCode, body)
	})
	for _, tt := range []struct {
		name, url string
		h2        bool
	}{
		{"client plain", "http://origin.test:" + port(t, o) + "/", false},
		{"client intercepted h1", "https://origin.test:" + port(t, so) + "/", false},
		{"client intercepted h2", "https://origin.test:" + port(t, so) + "/", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", tt.url, io.NopCloser(strings.NewReader("hello")))
			req.ContentLength = -1
			req.Trailer = http.Header{"Forwarded": {"host=evil.test"}, "X-Forwarded-Host": {"evil.test"}, "X-Checksum": {"c0ffee"}}
			if !tt.h2 {
				// HTTP/2 servers refuse these in a trailer themselves.
				req.Trailer["Host"] = []string{"evil.test"}
				req.Trailer["Authorization"] = []string{"Basic eDp5"}
			}
			resp, err := h.client(tt.h2).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			check(t, resp.StatusCode, string(b))
		})
	}
}

// TestTrailerDeclaredBodyCut: a guest that declares a trailer and cuts its
// chunked body is answered 400 request_body_cut, as without a trailer (the
// body the trailer is copied through still tells the exchange the guest
// broke it; it did not, and the proxy waited for the origin's answer to a
// request that could never be complete, until the idle timeout).
func TestTrailerDeclaredBodyCut(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	// An origin that reads the body to its end, as a real one would
	// (httptest.Server's Close would wait for it).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRaw(t, ln, func(c net.Conn, br *bufio.Reader) {
		if req, err := http.ReadRequest(br); err == nil {
			io.Copy(io.Discard, req.Body)
		}
	})
	_, pt, _ := net.SplitHostPort(ln.Addr().String())
	h.allowOrigin("origin.test", nil, pt)
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, "POST http://origin.test:"+pt+"/ HTTP/1.1\r\nHost: origin.test\r\nTrailer: X-Checksum\r\n"+
		"Transfer-Encoding: chunked\r\n\r\n5\r\nhel")
	c.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a cut body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 || resp.Header.Get("X-Abox-Reason") != ReasonBodyCut {
		t.Errorf("got %d %q, want 400 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonBodyCut)
	}
}
