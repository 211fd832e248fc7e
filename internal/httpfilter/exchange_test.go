package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestRevocationEndsUpstreamWait: a request whose origin is still thinking
// when the policy stops allowing its host ends at once, on the guest's side
// and on the origin's (the proxy closes its upstream connection), also when
// it is not the first exchange of the guest's connection and its upstream
// connection came from the pool: plain HTTP and inside an intercepted
// tunnel.
func TestRevocationEndsUpstreamWait(t *testing.T) {
	for _, intercepted := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "intercepted"}[intercepted], func(t *testing.T) {
			var ln net.Listener
			var err error
			if intercepted {
				leaf, lerr := testOriginCA(t).Leaf("gate.test")
				if lerr != nil {
					t.Fatal(lerr)
				}
				ln, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
			} else {
				ln, err = net.Listen("tcp", "127.0.0.1:0")
			}
			if err != nil {
				t.Fatal(err)
			}
			thinking, closed := make(chan struct{}, 1), make(chan struct{}, 1)
			serveRaw(t, ln, func(c net.Conn, br *bufio.Reader) {
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					if req.URL.Path == "/quick" {
						io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						continue
					}
					// Never answers: returns once the proxy closes.
					thinking <- struct{}{}
					io.Copy(io.Discard, br)
					closed <- struct{}{}
					return
				}
			})
			_, pt, _ := net.SplitHostPort(ln.Addr().String())
			h := newHarness(t, hopts{allow: []string{"gate.test"}})
			h.allowOrigin("gate.test", nil, pt)
			host := "gate.test:" + pt
			var c net.Conn
			target := "http://" + host
			if intercepted {
				tc := tls.Client(h.connect(t, host), &tls.Config{RootCAs: h.proxyCA, ServerName: "gate.test", NextProtos: []string{"http/1.1"}})
				if err := tc.Handshake(); err != nil {
					t.Fatal(err)
				}
				c, target = tc, ""
			} else {
				c = h.dialProxy(t)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			fmt.Fprintf(c, "GET %s/quick HTTP/1.1\r\nHost: %s\r\n\r\n", target, host)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("first request: %v %v", resp, err)
			}
			io.Copy(io.Discard, resp.Body)
			fmt.Fprintf(c, "GET %s/think HTTP/1.1\r\nHost: %s\r\n\r\n", target, host)
			select {
			case <-thinking:
			case <-time.After(10 * time.Second):
				t.Fatal("the second request never reached the origin")
			}
			if h.p.stats.upstreamDials.Load() != 1 {
				t.Fatalf("%d upstream dials, want 1: the second exchange was to reuse the pooled connection", h.p.stats.upstreamDials.Load())
			}
			if _, err := h.engine.Remove("gate.test"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("the origin's connection is still open 10 s after the revocation: the proxy still waits for its answer")
			}
			if resp, err := http.ReadResponse(br, nil); err == nil && resp.StatusCode == 200 {
				t.Fatalf("the guest got %d after the revocation", resp.StatusCode)
			}
		})
	}
}

// TestPooledConnectionOutlivesItsGuest: the end of a guest connection
// (which ends its context) leaves the upstream connection its last exchange
// gave back to the pool alone: the next guest's request reuses it.
func TestPooledConnectionOutlivesItsGuest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveRaw(t, ln, rawOrigin)
	_, pt, _ := net.SplitHostPort(ln.Addr().String())
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	h.allowOrigin("origin.test", nil, pt)
	for i := 0; i < 3; i++ {
		c := h.dialProxy(t)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET http://origin.test:%s/ HTTP/1.1\r\nHost: origin.test:%s\r\n\r\n", pt, pt)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("guest %d: %v %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		c.Close()
		// The proxy notices the close and ends the connection's context.
		for deadline := time.Now().Add(5 * time.Second); h.p.openH1() > 0 && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if n := h.p.stats.upstreamDials.Load(); n != 1 {
		t.Fatalf("%d upstream dials for three guests one after another, want 1: a guest's end closed the pooled connection", n)
	}
}

// openH1 is how many guest connections the HTTP/1 server is serving.
func (p *Proxy) openH1() int { return p.srv.Open() }
