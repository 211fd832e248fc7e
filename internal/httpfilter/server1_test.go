package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/httpfilter/h1"
)

// framingMux is the origin of the server loop's framing tests.
//
//	/echo     answers "METHOD PATH BODYLEN" with a Content-Length
//	/chunks   answers an unknown length in three flushed pieces
//	/cut      declares 100 bytes, sends 10 and drops the connection
//	/hints    sends 103 Early Hints, then 200
//	/nobody   answers 204
func framingMux(got *bodyLog) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/echo/", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		got.add(r.URL.Path, n, err)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, n)
	})
	mux.HandleFunc("/chunks", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "piece%d;", i)
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(200)
		io.WriteString(w, "0123456789")
		w.(http.Flusher).Flush()
		c, _, _ := http.NewResponseController(w).Hijack()
		c.Close()
	})
	mux.HandleFunc("/hints", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "after hints")
	})
	mux.HandleFunc("/nobody", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// bodyLog records the request bodies an origin received in full.
type bodyLog struct {
	mu sync.Mutex
	m  map[string]int64 // path: length of a body read to its end
}

func (b *bodyLog) add(path string, n int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]int64{}
	}
	if err == nil {
		b.m[path] = n
	}
}

func (b *bodyLog) get(path string) (int64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, ok := b.m[path]
	return n, ok
}

// framing is one guest connection to the proxy, plain or inside an
// intercepted tunnel, with the request form each needs.
type framing struct {
	t      *testing.T
	c      net.Conn
	br     *bufio.Reader
	prefix string // absolute-form prefix for plain HTTP, "" in a tunnel
	host   string
}

// newHTTPSOrigin1 is an HTTPS origin that speaks HTTP/1.1 only, so that
// the proxy's HTTP/1.1 exchange is the one under test.
func newHTTPSOrigin1(t *testing.T, mux http.Handler) *httptest.Server {
	s := httptest.NewUnstartedServer(mux)
	oca := testOriginCA(t)
	s.TLS = &tls.Config{
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return oca.Leaf(h.ServerName)
		},
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func newFraming(t *testing.T, inTunnel bool, o hopts) (*framing, *bodyLog, *harness) {
	t.Helper()
	if o.allow == nil {
		o.allow = []string{"origin.test"}
	}
	h := newHarness(t, o)
	got := &bodyLog{}
	var f *framing
	if inTunnel {
		so := newHTTPSOrigin1(t, framingMux(got))
		pt := port(t, so)
		h.allowOrigin("origin.test", so, pt)
		host := "origin.test:" + pt
		tc := tls.Client(h.connect(t, host), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		f = &framing{t: t, c: tc, host: host}
	} else {
		o := newHTTPOrigin(t, framingMux(got))
		pt := port(t, o)
		h.allowOrigin("origin.test", o, pt)
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		f = &framing{t: t, c: c, host: "origin.test:" + pt, prefix: "http://origin.test:" + pt}
	}
	t.Cleanup(func() { f.c.Close() })
	f.c.SetDeadline(time.Now().Add(20 * time.Second))
	f.br = bufio.NewReader(f.c)
	return f, got, h
}

// req is the raw text of a request for path with extra header lines.
func (f *framing) req(method, path, headers, body string) string {
	target := f.prefix + path
	return fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n%s", method, target, f.host, headers, body)
}

func (f *framing) send(s string) {
	f.t.Helper()
	if _, err := io.WriteString(f.c, s); err != nil {
		f.t.Fatalf("writing request: %v", err)
	}
}

// read reads one answer to a request of method and its whole body.
func (f *framing) read(method string) (*http.Response, string) {
	f.t.Helper()
	resp, err := http.ReadResponse(f.br, &http.Request{Method: method})
	if err != nil {
		f.t.Fatalf("reading the answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatalf("reading the body of %d: %v", resp.StatusCode, err)
	}
	return resp, string(b)
}

// closed reports whether the proxy closed the connection (no further answer).
func (f *framing) closed() bool {
	f.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer f.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := f.br.ReadByte()
	return err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func chunked(s string) string {
	return fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(s), s)
}

func bothForms(t *testing.T, fn func(t *testing.T, inTunnel bool)) {
	for _, inTunnel := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tunnel"}[inTunnel], func(t *testing.T) { fn(t, inTunnel) })
	}
}

// TestServerKeepAlive: one connection carries many requests of every
// framing (no body, Content-Length, chunked, HEAD, 204, a chunked answer)
// and each answer is the one to its own request.
func TestServerKeepAlive(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		for i := 0; i < 60; i++ {
			path := fmt.Sprintf("/echo/%d", i)
			var method, want string
			switch i % 6 {
			case 0:
				method, want = "GET", "GET "+path+" 0"
				f.send(f.req(method, path, "", ""))
			case 1:
				body := strings.Repeat("b", i*100)
				method, want = "POST", fmt.Sprintf("POST %s %d", path, len(body))
				f.send(f.req(method, path, "Content-Length: "+strconv.Itoa(len(body))+"\r\n", body))
			case 2:
				method, want = "PUT", "PUT "+path+" 5"
				f.send(f.req(method, path, "Transfer-Encoding: chunked\r\n", chunked("hello")))
			case 3:
				method, want = "HEAD", ""
				f.send(f.req(method, path, "", ""))
			case 4:
				method, want = "GET", "piece0;piece1;piece2;"
				f.send(f.req(method, "/chunks", "", ""))
			case 5:
				method, want = "GET", ""
				f.send(f.req(method, "/nobody", "", ""))
			}
			resp, body := f.read(method)
			if body != want {
				t.Fatalf("request %d (%s): answer %d %q, want %q", i, method, resp.StatusCode, body, want)
			}
			if method == "HEAD" && resp.ContentLength != int64(len("HEAD "+path+" 0")) {
				t.Errorf("HEAD %s: Content-Length %d, want the GET's", path, resp.ContentLength)
			}
			if resp.Close {
				t.Fatalf("request %d: the answer closes the connection", i)
			}
		}
	})
}

// TestServerPipelining: requests sent together before any answer is read
// (bodies included) are answered in order, each once.
func TestServerPipelining(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		var all strings.Builder
		var want []string
		for i := 0; i < 12; i++ {
			path := fmt.Sprintf("/echo/p%d", i)
			switch i % 3 {
			case 0:
				all.WriteString(f.req("GET", path, "", ""))
				want = append(want, "GET "+path+" 0")
			case 1:
				all.WriteString(f.req("POST", path, "Content-Length: 3\r\n", "abc"))
				want = append(want, "POST "+path+" 3")
			case 2:
				all.WriteString(f.req("POST", path, "Transfer-Encoding: chunked\r\n", chunked("chunky")))
				want = append(want, "POST "+path+" 6")
			}
		}
		f.send(all.String())
		for i, w := range want {
			if _, body := f.read("GET"); body != w {
				t.Fatalf("answer %d: %q, want %q", i, body, w)
			}
		}
	})
}

// TestServerSecondRequestBeforeFirstAnswer: a guest that writes its next
// request while the first is still being answered gets both, in order.
func TestServerSecondRequestBeforeFirstAnswer(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		f.send(f.req("GET", "/chunks", "", ""))
		f.send(f.req("GET", "/echo/second", "", ""))
		if _, body := f.read("GET"); body != "piece0;piece1;piece2;" {
			t.Fatalf("first answer %q", body)
		}
		if _, body := f.read("GET"); body != "GET /echo/second 0" {
			t.Fatalf("second answer %q", body)
		}
	})
}

// TestServerDrainsUnreadBody: a refusal never reads the request body; the
// server reads and drops it (up to h1.MaxDrain) so the next request on the
// connection is parsed from where it really starts. A larger body closes
// the connection instead, and none of its bytes is taken for a request.
func TestServerDrainsUnreadBody(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, got, _ := newFraming(t, inTunnel, hopts{})
		// Inside a tunnel a request for another host is refused (fronting);
		// outside, blocked.test is not allowlisted.
		refused := func(path, headers, body string) string {
			if inTunnel {
				return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: blocked.test\r\n%s\r\n%s", path, headers, body)
			}
			return fmt.Sprintf("POST http://blocked.test%s HTTP/1.1\r\nHost: blocked.test\r\n%s\r\n%s", path, headers, body)
		}
		// A body that looks like a request: it must never be served as one.
		inner := f.req("GET", "/echo/smuggled", "", "")
		body := inner + strings.Repeat("x", 10<<10)
		if inTunnel {
			// Fronting closes the connection (the rest of the body may
			// meet a closed socket); the drain is seen outside.
			go io.WriteString(f.c, refused("/", "Content-Length: "+strconv.Itoa(len(body))+"\r\n", body))
			if resp, _ := f.read("POST"); resp.StatusCode != 403 {
				t.Fatalf("fronting: %d", resp.StatusCode)
			}
			if !f.closed() {
				t.Fatal("the connection stayed open after a fronting refusal")
			}
			if _, ok := got.get("/echo/smuggled"); ok {
				t.Fatal("the refused request's body was served as a request")
			}
			return
		}
		f.send(refused("/", "Content-Length: "+strconv.Itoa(len(body))+"\r\n", body))
		if resp, _ := f.read("POST"); resp.StatusCode != 403 {
			t.Fatalf("blocked POST: %d", resp.StatusCode)
		}
		f.send(f.req("GET", "/echo/after", "", ""))
		if resp, b := f.read("GET"); resp.StatusCode != 200 || b != "GET /echo/after 0" {
			t.Fatalf("the request after a drained body: %d %q", resp.StatusCode, b)
		}
		f.send(refused("/", "Transfer-Encoding: chunked\r\n", chunked(body)))
		if resp, _ := f.read("POST"); resp.StatusCode != 403 {
			t.Fatalf("blocked chunked POST: %d", resp.StatusCode)
		}
		f.send(f.req("GET", "/echo/after2", "", ""))
		if _, b := f.read("GET"); b != "GET /echo/after2 0" {
			t.Fatalf("the request after a drained chunked body: %q", b)
		}
		big := inner + strings.Repeat("y", h1.MaxDrain+(64<<10))
		go io.WriteString(f.c, refused("/", "Content-Length: "+strconv.Itoa(len(big))+"\r\n", big)+f.req("GET", "/echo/late", "", ""))
		if resp, _ := f.read("POST"); resp.StatusCode != 403 {
			t.Fatalf("blocked large POST: %d", resp.StatusCode)
		}
		if !f.closed() {
			t.Fatal("the connection stayed open after a body larger than the drain limit")
		}
		for _, p := range []string{"/echo/smuggled", "/echo/late"} {
			if _, ok := got.get(p); ok {
				t.Errorf("%s was served: a body was parsed as requests", p)
			}
		}
	})
}

// TestServerGuestClosesMidBody: a request body cut by the guest never
// reaches the origin as a whole request, and the origin's answer to what
// it got is not relayed (request_body_cut).
func TestServerGuestClosesMidBody(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, got, h := newFraming(t, inTunnel, hopts{})
		f.send(f.req("POST", "/echo/cut", "Content-Length: 1000\r\n", strings.Repeat("z", 10)))
		time.Sleep(100 * time.Millisecond)
		if cw, ok := f.c.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		f.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if resp, err := http.ReadResponse(f.br, nil); err == nil && resp.StatusCode == 200 {
			t.Errorf("a cut request body was answered 200")
		}
		waitFor(t, func() bool { return h.lastLog("path", "/echo/cut") != nil }, "the request's decision line")
		// Never the origin's answer to the truncated request (a TLS
		// origin may answer between close_notify and the close).
		if l := h.lastLog("path", "/echo/cut"); l["reason"] != ReasonBodyCut || l["status"] != 400.0 {
			t.Errorf("decision line %v, want %s 400", l, ReasonBodyCut)
		}
		if n, ok := got.get("/echo/cut"); ok {
			t.Errorf("the origin read a whole body of %d bytes from a cut request", n)
		}
	})
}

// TestServerOriginCutsBody: an answer whose body breaks reaches the guest
// visibly cut (short of its Content-Length), never as a whole answer.
func TestServerOriginCutsBody(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		f.send(f.req("GET", "/cut", "", ""))
		resp, err := http.ReadResponse(f.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		if err == nil {
			t.Fatalf("a cut body read as whole: %q", b)
		}
		if !f.closed() {
			t.Fatal("the connection stayed open after a cut answer")
		}
	})
}

// TestServerConnectionClose: Connection: close and HTTP/1.0 without
// keep-alive end the connection after the answer; HTTP/1.0 with keep-alive
// keeps it, with a Content-Length and Connection: keep-alive.
func TestServerConnectionClose(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		t.Run("close", func(t *testing.T) {
			f, _, _ := newFraming(t, inTunnel, hopts{})
			f.send(f.req("GET", "/echo/c", "Connection: close\r\n", ""))
			if resp, _ := f.read("GET"); !resp.Close {
				t.Error("the answer to Connection: close does not say close")
			}
			if !f.closed() {
				t.Error("the connection stayed open after Connection: close")
			}
		})
		t.Run("http/1.0", func(t *testing.T) {
			f, _, _ := newFraming(t, inTunnel, hopts{})
			f.send(fmt.Sprintf("GET %s/chunks HTTP/1.0\r\nHost: %s\r\n\r\n", f.prefix, f.host))
			if _, b := f.read("GET"); b != "piece0;piece1;piece2;" {
				t.Errorf("HTTP/1.0 answer of unknown length: %q", b)
			}
			if !f.closed() {
				t.Error("an HTTP/1.0 connection without keep-alive stayed open")
			}
		})
		t.Run("http/1.0 keep-alive", func(t *testing.T) {
			f, _, _ := newFraming(t, inTunnel, hopts{})
			for i := 0; i < 3; i++ {
				f.send(fmt.Sprintf("GET %s/echo/k%d HTTP/1.0\r\nHost: %s\r\nConnection: keep-alive\r\n\r\n", f.prefix, i, f.host))
				resp, b := f.read("GET")
				if b != fmt.Sprintf("GET /echo/k%d 0", i) || resp.ContentLength != int64(len(b)) || resp.Header.Get("Connection") != "keep-alive" {
					t.Fatalf("HTTP/1.0 keep-alive answer %d: %q, length %d, Connection %q", i, b, resp.ContentLength, resp.Header.Get("Connection"))
				}
			}
		})
	})
}

// TestServerExpectContinue: 100 Continue comes before the body is sent,
// and the connection carries the next request after it.
func TestServerExpectContinue(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		f.send(f.req("POST", "/echo/e", "Content-Length: 4\r\nExpect: 100-continue\r\n", ""))
		line, err := f.br.ReadString('\n')
		if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
			t.Fatalf("first line %q (%v), want 100 Continue before the body", line, err)
		}
		if l, _ := f.br.ReadString('\n'); l != "\r\n" {
			t.Fatalf("100 Continue followed by %q", l)
		}
		f.send("body")
		if _, b := f.read("POST"); b != "POST /echo/e 4" {
			t.Fatalf("answer %q", b)
		}
		f.send(f.req("GET", "/echo/next", "", ""))
		if _, b := f.read("GET"); b != "GET /echo/next 0" {
			t.Fatalf("next answer %q", b)
		}
		f.send(f.req("POST", "/echo/x", "Content-Length: 4\r\nExpect: something-else\r\n", "body"))
		if resp, _ := f.read("POST"); resp.StatusCode != http.StatusExpectationFailed {
			t.Fatalf("unknown expectation: %d, want 417", resp.StatusCode)
		}
	})
}

// TestServerInformational: 103 Early Hints from the origin reach the
// guest ahead of the final answer.
func TestServerInformational(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{})
		f.send(f.req("GET", "/hints", "", ""))
		line, _ := f.br.ReadString('\n')
		if line != "HTTP/1.1 103 Early Hints\r\n" {
			t.Fatalf("first line %q, want 103", line)
		}
		tp, err := http.ReadResponse(bufio.NewReader(strings.NewReader("HTTP/1.1 200 OK\r\n"+readHeaderBlock(t, f.br))), nil)
		if err != nil || tp.Header.Get("Link") == "" {
			t.Fatalf("103 without its Link: %v %v", tp, err)
		}
		if resp, b := f.read("GET"); resp.StatusCode != 200 || b != "after hints" {
			t.Fatalf("final answer %d %q", resp.StatusCode, b)
		}
	})
}

func readHeaderBlock(t *testing.T, br *bufio.Reader) string {
	var s strings.Builder
	for {
		l, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		s.WriteString(l)
		if l == "\r\n" {
			return s.String()
		}
	}
}

// TestServerHeaderTimeout: a request header that takes longer than the
// handshake timeout ends the connection, on a new connection and between
// requests alike; an idle keep-alive connection is not held to it.
func TestServerHeaderTimeout(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		f, _, _ := newFraming(t, inTunnel, hopts{handshake: 400 * time.Millisecond})
		f.send(f.req("GET", "/echo/1", "", ""))
		f.read("GET")
		time.Sleep(600 * time.Millisecond) // idle, not in a header
		f.send(f.req("GET", "/echo/2", "", ""))
		if _, b := f.read("GET"); b != "GET /echo/2 0" {
			t.Fatalf("after an idle pause: %q", b)
		}
		start := time.Now()
		f.send("GET " + f.prefix + "/echo/3 HTTP/1.1\r\nHost: " + f.host + "\r\n")
		for i := 0; i < 20 && time.Since(start) < 3*time.Second; i++ {
			time.Sleep(100 * time.Millisecond)
			if _, err := io.WriteString(f.c, "X-Slow: a\r\n"); err != nil {
				break
			}
		}
		if !f.closed() {
			t.Fatal("a header trickled for 2s stayed open")
		}
		if d := time.Since(start); d > 2500*time.Millisecond {
			t.Errorf("closed after %v, want about the 400ms timeout", d)
		}
	})
}

// TestServerClosesAfterGuardRefusal: once the h1 guard refuses a request
// the connection ends at once (not at the client's timeout), before or
// after a request it served.
func TestServerClosesAfterGuardRefusal(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		for _, first := range []bool{false, true} {
			f, _, _ := newFraming(t, inTunnel, hopts{})
			if first {
				f.send(f.req("GET", "/echo/ok", "", ""))
				f.read("GET")
			}
			f.send(f.req("POST", "/echo/bad", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"))
			if resp, _ := f.read("POST"); resp.StatusCode != 400 {
				t.Fatalf("CL with TE: %d, want 400", resp.StatusCode)
			}
			start := time.Now()
			if !f.closed() || time.Since(start) > 2*time.Second {
				t.Fatalf("after a refusal the connection stayed open for %v", time.Since(start))
			}
		}
	})
}

// TestServerLoopRefusalsLogged: a request the server loop itself refuses
// (unparsable, not HTTP/1.x, no or a malformed Host, a bad field, an
// unknown expectation) gets its reason in X-Abox-Reason, one blocked
// decision line with that reason, and the end of the connection.
func TestServerLoopRefusalsLogged(t *testing.T) {
	bothForms(t, func(t *testing.T, inTunnel bool) {
		cases := []struct {
			text, reason string
			status       int
		}{
			{" / HTTP/1.1\r\nHost: {H}\r\n\r\n", ReasonMalformedRequest, 400},
			{"GET {T}\r\n\r\n", ReasonMalformedRequest, 400},
			{"GET {T} HTTP/2.0\r\nHost: {H}\r\n\r\n", ReasonHTTPVersion, 505},
			{"GET {T} HTTP/1.1\r\n\r\n", ReasonMissingHost, 400},
			{"GET {T} HTTP/1.1\r\nHost: {H}\r\nHost: other.test\r\n\r\n", ReasonMalformedRequest, 400},
			{"GET {T} HTTP/1.1\r\nHost: a b\r\n\r\n", ReasonMalformedHost, 400},
			{"GET {T} HTTP/1.1\r\nHost: {H}\r\nX: a\x00b\r\n\r\n", ReasonMalformedRequest, 400},
			{"GET {T} HTTP/1.1\r\nHost: {H}\r\nX: a\u0085b\r\nX\u00a0: v\r\n\r\n", "invalid_header", 400},
			{"GET {T} HTTP/1.1\r\nHost: {H}\r\nExpect: 200-ok\r\n\r\n", ReasonExpectation, 417},
		}
		for _, c := range cases {
			f, _, h := newFraming(t, inTunnel, hopts{})
			text := strings.NewReplacer("{T}", f.prefix+"/echo/x", "{H}", f.host).Replace(c.text)
			before := len(h.log.lines())
			f.send(text)
			resp, _ := f.read("GET")
			if resp.StatusCode != c.status || resp.Header.Get("X-Abox-Reason") != c.reason {
				t.Errorf("%q: %d %q, want %d %q", text, resp.StatusCode, resp.Header.Get("X-Abox-Reason"), c.status, c.reason)
			}
			if !f.closed() {
				t.Errorf("%q: the connection stayed open", text)
			}
			var got []string
			for _, l := range h.log.lines()[before:] {
				if l["kind"] == "http" {
					got = append(got, fmt.Sprint(l["verdict"], " ", l["reason"], " ", l["status"]))
				}
			}
			if want := fmt.Sprint("block ", c.reason, " ", c.status); len(got) != 1 || got[0] != want {
				t.Errorf("%q: decision lines %q, want one %q", text, got, want)
			}
		}
	})
}
