package httpfilter

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/decisionlog"
)

// TestTraceNeverForwarded: TRACE and TRACK are answered 405 by the proxy on
// every path (plain HTTP, intercepted HTTP/1.1 and HTTP/2) and never reach
// the origin, which would echo the request, credentials included.
func TestTraceNeverForwarded(t *testing.T) {
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"origin.test"}, dialer: d})
	o, so := newHTTPOrigin(t, originMux()), newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, m := range []string{"TRACE", "TRACK", "trace"} {
		for _, c := range []struct {
			name string
			url  string
			h2   bool
		}{
			{"plain", "http://origin.test:" + port(t, o) + "/", false},
			{"mitm h1", "https://origin.test:" + port(t, so) + "/", false},
			{"mitm h2", "https://origin.test:" + port(t, so) + "/", true},
		} {
			req, _ := http.NewRequest(m, c.url, nil)
			req.Header.Set("Authorization", "Bearer secret")
			resp, err := h.client(c.h2).Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", m, c.name, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("X-Abox-Reason") != ReasonTraceRefused {
				t.Errorf("%s %s: %d %s, want 405 %s", m, c.name, resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonTraceRefused)
			}
		}
	}
	for _, a := range d.dialed() {
		t.Errorf("TRACE reached the origin: dialled %s", a)
	}
}

// TestRequestSizeLimits: a request target longer than 8 KiB is answered 414
// and one header field longer than 16 KiB 431, over HTTP/1.1 (the guard) and
// HTTP/2 (which the guard never sees) alike; nothing is forwarded.
func TestRequestSizeLimits(t *testing.T) {
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"origin.test"}, dialer: d})
	so := newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", so, port(t, so))
	base := "https://origin.test:" + port(t, so) + "/"
	for _, h2 := range []bool{false, true} {
		for _, c := range []struct {
			name   string
			req    func() *http.Request
			status int
			reason string
		}{
			{"long target", func() *http.Request {
				r, _ := http.NewRequest("GET", base+strings.Repeat("a", 9<<10), nil)
				return r
			}, 414, ReasonURITooLong},
			{"long field", func() *http.Request {
				r, _ := http.NewRequest("GET", base, nil)
				r.Header.Set("X-Big", strings.Repeat("b", 17<<10))
				return r
			}, 431, ReasonFieldTooLarge},
		} {
			t.Run(fmt.Sprintf("h2=%v %s", h2, c.name), func(t *testing.T) {
				resp, err := h.client(h2).Do(c.req())
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != c.status || resp.Header.Get("X-Abox-Reason") != c.reason {
					t.Errorf("%d %s, want %d %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), c.status, c.reason)
				}
			})
		}
	}
	for _, a := range d.dialed() {
		t.Errorf("an oversized request reached the origin: dialled %s", a)
	}
}

// TestH2FrontingRefusedAlone: on an intercepted HTTP/2 connection, a stream
// naming another authority is answered 421 on its own; a stream already
// flowing on the connection keeps flowing, and later streams are served on
// the same connection.
func TestH2FrontingRefusedAlone(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test", "other.test"}})
	mux := streamMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	so := newHTTPSOrigin(t, mux)
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	h.res.set("other.test", "127.0.0.1")
	c := h.client(true)
	resp, err := c.Get("https://origin.test:" + pt + "/stream")
	if err != nil || resp.ProtoMajor != 2 {
		t.Fatalf("stream: %v %v", resp, err)
	}
	defer resp.Body.Close()
	lines := make(chan error, 100)
	go func() {
		buf := make([]byte, 64)
		for {
			_, err := resp.Body.Read(buf)
			lines <- err
			if err != nil {
				return
			}
		}
	}()
	req, _ := http.NewRequest("GET", "https://origin.test:"+pt+"/", nil)
	req.Host = "other.test:" + pt
	fr, err := c.Do(req)
	if err != nil {
		t.Fatalf("fronting stream: %v", err)
	}
	fr.Body.Close()
	if fr.StatusCode != http.StatusMisdirectedRequest || fr.Header.Get("X-Abox-Reason") != ReasonDomainFronting {
		t.Errorf("fronting stream: %d %s, want 421 %s", fr.StatusCode, fr.Header.Get("X-Abox-Reason"), ReasonDomainFronting)
	}
	for i := 0; i < 3; i++ {
		if err := <-lines; err != nil {
			t.Fatalf("the other stream ended with the fronting one: %v", err)
		}
	}
	ok, err := c.Get("https://origin.test:" + pt + "/")
	if err != nil || ok.StatusCode != 200 {
		t.Fatalf("a later stream: %v %v", ok, err)
	}
	ok.Body.Close()
	if n := h.p.stats.intercepted.Load(); n != 1 {
		t.Errorf("%d intercepted tunnels, want every stream on the first one", n)
	}
}

// TestRefusalFloodAggregated: a guest repeating a refused request over new
// connections (a new source port each time) writes its budget of decision
// lines; the rest are counted for its address, not its ports.
func TestRefusalFloodAggregated(t *testing.T) {
	h := newHarness(t, hopts{decisions: true})
	const n = 100
	for i := 0; i < n; i++ {
		resp, _ := h.rawRequest(t, "GET http://blocked.example.org/ HTTP/1.1\r\nHost: blocked.example.org\r\n\r\n")
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("request %d: %d, want 403", i, resp.StatusCode)
		}
	}
	h.lines.Sync()
	written := 0
	for _, l := range h.log.lines() {
		if l["msg"] == "request" && l["reason"] == "not_allowlisted" {
			written++
		}
	}
	st := h.p.Stats().(Stats)
	if written > decisionlog.DefaultRefusalsPerClient || st.Log == nil || st.Log.Suppressed != uint64(n-written) {
		t.Errorf("%d lines written, status log %+v; want at most %d lines and the rest counted", written, st.Log, decisionlog.DefaultRefusalsPerClient)
	}
}
