package httpfilter

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/policy"
)

// TestRevokedOnPolicyChange: a tunnel, an intercepted stream or a plain-HTTP
// stream that a policy allowed is closed when the policy stops allowing its
// host (here passive to active); one that is still allowed keeps flowing.
func TestRevokedOnPolicyChange(t *testing.T) {
	h := newHarness(t, hopts{passive: true, allow: []string{"kept.test"}, exceptions: []string{"tunnel.test"}})
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := io.WriteString(w, "data: x\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	o := newHTTPOrigin(t, mux)
	so := newHTTPSOrigin(t, mux)
	pt, spt := port(t, o), port(t, so)
	for _, n := range []string{"kept.test", "plain.test", "tunnel.test", "mitm.test"} {
		h.allowOrigin(n, o, pt)
	}
	h.p.ports[uint16(mustAtoi(spt))] = true

	// stream sends a request on c and returns the body's lines; the channel
	// closes when the body or the connection ends.
	stream := func(name string, c net.Conn, req string) <-chan string {
		t.Helper()
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, req)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %v %v", name, resp, err)
		}
		ch := make(chan string, 1000)
		go func() {
			defer close(ch)
			lr := bufio.NewReader(resp.Body)
			for {
				l, err := lr.ReadString('\n')
				if err != nil {
					return
				}
				ch <- l
			}
		}()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no first line", name)
		}
		return ch
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	kept := stream("kept", dial(), "GET http://kept.test:"+pt+"/stream HTTP/1.1\r\nHost: kept.test\r\n\r\n")
	streams := map[string]<-chan string{
		"plain": stream("plain", dial(), "GET http://plain.test:"+pt+"/stream HTTP/1.1\r\nHost: plain.test\r\n\r\n"),
		"tunnel": stream("tunnel", tls.Client(h.connect(t, "tunnel.test:"+spt), &tls.Config{RootCAs: h.roots, ServerName: "tunnel.test", NextProtos: []string{"http/1.1"}}),
			"GET /stream HTTP/1.1\r\nHost: tunnel.test:"+spt+"\r\n\r\n"),
		"mitm": stream("mitm", tls.Client(h.connect(t, "mitm.test:"+spt), &tls.Config{RootCAs: h.proxyCA, ServerName: "mitm.test", NextProtos: []string{"http/1.1"}}),
			"GET /stream HTTP/1.1\r\nHost: mitm.test:"+spt+"\r\n\r\n"),
	}

	h.engine.SetMode(policy.Active)
	for name, ch := range streams {
		deadline := time.After(5 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					break drain
				}
			case <-deadline:
				t.Errorf("%s: still streaming 5s after its host stopped being allowed", name)
				break drain
			}
		}
	}
	// The allowlisted stream is untouched.
	for i := 0; i < 5; i++ {
		select {
		case _, ok := <-kept:
			if !ok {
				t.Fatalf("allowlisted stream closed by the mode change")
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("allowlisted stream stalled")
		}
	}
	if l := h.lastLog("reason", ReasonRevoked); l == nil {
		t.Errorf("no log line with reason %s", ReasonRevoked)
	}
}
