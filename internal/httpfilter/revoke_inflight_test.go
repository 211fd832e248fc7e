package httpfilter

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/policy"
)

// streamMux serves /stream: a line every 50 ms until the client goes away.
func streamMux() *http.ServeMux {
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
	return mux
}

// openStream sends req on c and returns the body's lines after the first;
// the channel closes when the body or the connection ends.
func openStream(t *testing.T, name string, c net.Conn, req string) <-chan string {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
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

func waitClosed(t *testing.T, name string, ch <-chan string) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Errorf("%s: still streaming 5s after its host stopped being allowed", name)
			return
		}
	}
}

func stillFlowing(t *testing.T, name string, ch <-chan string) {
	t.Helper()
	for i := 0; i < 3; i++ {
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("%s: closed although still allowed", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: stalled", name)
		}
	}
}

func (h *harness) dialProxy(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestIPLiteralRevokedOnActive: connections to IP literals, allowed in
// passive mode only, are closed by the switch to active mode.
func TestIPLiteralRevokedOnActive(t *testing.T) {
	h := newHarness(t, hopts{passive: true, allow: []string{"kept.test"}})
	o := newHTTPOrigin(t, streamMux())
	pt := port(t, o)
	h.allowOrigin("kept.test", o, pt)
	kept := openStream(t, "kept", h.dialProxy(t), "GET http://kept.test:"+pt+"/stream HTTP/1.1\r\nHost: kept.test\r\n\r\n")
	streams := map[string]<-chan string{
		"plain literal": openStream(t, "plain literal", h.dialProxy(t), "GET http://127.0.0.1:"+pt+"/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
		// A CONNECT tunnel to the literal, carrying plain HTTP.
		"connect literal": openStream(t, "connect literal", h.connect(t, "127.0.0.1:"+pt),
			"GET /stream HTTP/1.1\r\nHost: 127.0.0.1:"+pt+"\r\n\r\n"),
	}
	h.engine.SetMode(policy.Active)
	for name, ch := range streams {
		waitClosed(t, name, ch)
	}
	stillFlowing(t, "kept", kept)
}

// gateResolver holds lookups of one name until released, so a test can
// change the policy while a decision is in flight.
type gateResolver struct {
	*fakeResolver
	name    string
	started chan struct{}
	release chan struct{}
}

func (g *gateResolver) LookupNetIP(ctx context.Context, host string) ([]netip.Addr, error) {
	if host == g.name {
		g.started <- struct{}{}
		<-g.release
	}
	return g.fakeResolver.LookupNetIP(ctx, host)
}

// TestInFlightDecisionRevoked: a request or tunnel whose decision (here its
// lookup) was running when the policy changed does not outlive the change,
// although the pass that closed open connections ran before it was held.
func TestInFlightDecisionRevoked(t *testing.T) {
	o := newHTTPOrigin(t, streamMux())
	pt := port(t, o)
	for _, tc := range []struct {
		name    string
		passive bool
		req     func(host string) string
		change  func(h *harness) error
	}{
		{"plain http, passive to active", true,
			func(host string) string {
				return fmt.Sprintf("GET http://%s:%s/stream HTTP/1.1\r\nHost: %s\r\n\r\n", host, pt, host)
			},
			func(h *harness) error { h.engine.SetMode(policy.Active); return nil }},
		{"plain http, entry removed", false,
			func(host string) string {
				return fmt.Sprintf("GET http://%s:%s/stream HTTP/1.1\r\nHost: %s\r\n\r\n", host, pt, host)
			},
			func(h *harness) error { _, err := h.engine.Remove("gate.test"); return err }},
		{"connect, entry removed", false,
			func(host string) string {
				return fmt.Sprintf("CONNECT %s:%s HTTP/1.1\r\nHost: %s:%s\r\n\r\n", host, pt, host, pt)
			},
			func(h *harness) error { _, err := h.engine.Remove("gate.test"); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &gateResolver{fakeResolver: newFakeResolver(), name: "gate.test", started: make(chan struct{}, 1), release: make(chan struct{})}
			allow := []string{"gate.test"}
			if tc.passive {
				allow = []string{"other.test"}
			}
			h := newHarness(t, hopts{passive: tc.passive, allow: allow, resolver: g})
			g.set("gate.test", "127.0.0.1")
			h.p.ports[uint16(mustAtoi(pt))] = true
			c := h.dialProxy(t)
			defer c.Close()
			io.WriteString(c, tc.req("gate.test"))
			select {
			case <-g.started:
			case <-time.After(5 * time.Second):
				t.Fatal("lookup never started")
			}
			seen := h.p.stats.policyChanges.Load()
			if err := tc.change(h); err != nil {
				t.Fatal(err)
			}
			// Let the revocation pass for this change run while the
			// decision is still in flight.
			for deadline := time.Now().Add(5 * time.Second); h.p.stats.policyChanges.Load() == seen; {
				if time.Now().After(deadline) {
					t.Fatal("the proxy never noticed the policy change")
				}
				time.Sleep(10 * time.Millisecond)
			}
			close(g.release)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
			if err != nil {
				return // closed without an answer: not allowed through either
			}
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != ReasonRevoked {
				t.Errorf("got %d %s, want 403 %s: the decision outlived the policy that took it", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonRevoked)
			}
		})
	}
}
