package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
)

// droppingOrigin answers the first request on each connection, then reads
// the next one and closes without answering: an origin whose keep-alive
// timeout fell between two requests.
type droppingOrigin struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []string // request lines of the dropped requests
}

func startDroppingOrigin(t *testing.T) *droppingOrigin {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &droppingOrigin{ln: ln}
	serveRaw(t, ln, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		if r, err := http.ReadRequest(br); err == nil {
			o.mu.Lock()
			o.seen = append(o.seen, r.Method)
			o.mu.Unlock()
		}
	})
	return o
}

// serveRaw runs serve on every connection ln accepts, until the test ends.
func serveRaw(t testing.TB, ln net.Listener, serve func(net.Conn, *bufio.Reader)) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
}

// TestStaleConnectionRetry: a pooled connection the origin closed while a
// request was on its way is retried on a new connection when the request is
// idempotent, and answered 502 otherwise (the origin may have acted on it).
func TestStaleConnectionRetry(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := startDroppingOrigin(t)
	_, pt, _ := net.SplitHostPort(o.ln.Addr().String())
	h.allowOrigin("origin.test", nil, pt)
	c := h.client(false)
	u := "http://origin.test:" + pt + "/"
	for i, tc := range []struct {
		method string
		want   int
	}{{"GET", 200}, {"GET", 200}, {"POST", 502}} {
		req, _ := http.NewRequest(tc.method, u, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%d %s: %v", i, tc.method, err)
		}
		resp.Body.Close()
		if i > 0 && resp.StatusCode != tc.want {
			t.Errorf("%s on a connection the origin dropped: %d, want %d", tc.method, resp.StatusCode, tc.want)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.seen) < 2 || o.seen[len(o.seen)-1] != "POST" {
		t.Errorf("dropped requests %v, want the POST sent once", o.seen)
	}
}

// TestBytesPastAResponseNeverAnswerTheNext: an origin that sends more than
// the response (a second, unasked one) in the same TLS record cannot have
// those bytes taken as the answer to the guest's next request: the
// connection is not reused.
func TestBytesPastAResponseNeverAnswerTheNext(t *testing.T) {
	leaf, err := testOriginCA(t).Leaf("origin.test")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	serveRaw(t, ln, func(c net.Conn, br *bufio.Reader) {
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\ngenuine"+
				"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled")
		}
	})
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	_, pt, _ := net.SplitHostPort(ln.Addr().String())
	h.allowOrigin("origin.test", nil, pt)
	c := h.client(false)
	for i := 0; i < 3; i++ {
		resp, body := get(t, c, "https://origin.test:"+pt+"/")
		if resp.StatusCode != 200 || body != "genuine" {
			t.Fatalf("request %d: %d %q, want the genuine answer", i, resp.StatusCode, body)
		}
	}
}
