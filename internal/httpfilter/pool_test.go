package httpfilter

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/egress"
)

// connOrigin is a plain HTTP/1.1 origin that names itself in X-Origin and
// counts the connections it accepted and saw closed.
type connOrigin struct {
	*httptest.Server
	name           string
	opened, closed atomic.Int64
	mu             sync.Mutex
	sni            []string // TLS server names of its handshakes, in order
}

func startConnOrigin(t *testing.T, name, addr string, useTLS bool) *connOrigin {
	return startOrigin(t, name, addr, useTLS, false)
}

// startConnOriginMux is a plain connOrigin serving mux.
func startConnOriginMux(t *testing.T, mux http.Handler) *connOrigin {
	return startOriginWith(t, "mux", "", false, false, mux)
}

// startOrigin starts a connOrigin; h2 offers HTTP/2 (TLS only).
func startOrigin(t *testing.T, name, addr string, useTLS, h2 bool) *connOrigin {
	return startOriginWith(t, name, addr, useTLS, h2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Origin", name)
		w.Header().Set("X-Proto", r.Proto)
		fmt.Fprintf(w, "%s %s\n", name, r.Host)
	}))
}

func startOriginWith(t *testing.T, name, addr string, useTLS, h2 bool, handler http.Handler) *connOrigin {
	t.Helper()
	o := &connOrigin{name: name}
	s := httptest.NewUnstartedServer(handler)
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("listening on %s: %v", addr, err)
		}
		s.Listener.Close()
		s.Listener = ln
	}
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			o.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			o.closed.Add(1)
		}
	}
	if useTLS {
		oca := testOriginCA(t)
		s.TLS = &tls.Config{
			NextProtos: []string{"http/1.1"}, // HTTP/1.1 only: the proxy's own pool
			GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
				o.mu.Lock()
				o.sni = append(o.sni, h.ServerName)
				o.mu.Unlock()
				return oca.Leaf(h.ServerName)
			},
		}
		if h2 {
			s.TLS.NextProtos = []string{"h2", "http/1.1"}
			s.EnableHTTP2 = true
		}
		s.StartTLS()
	} else {
		s.Start()
	}
	o.Server = s
	t.Cleanup(s.Close)
	return o
}

func (o *connOrigin) names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.sni...)
}

func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestPoolKeyedByCheckedAddress: upstream connections are reused only for
// a request whose own decision checked the address they are connected to,
// for the same host: once the name resolves to another address, a
// connection kept to the old one is not used; a cached answer that is now
// private is refused before any pooled connection is considered; and a TLS
// connection verified for one name never carries another name's request,
// although both names resolve to the same address.
func TestPoolKeyedByCheckedAddress(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"name.test", "a.test", "b.test"}, permit: []string{"127.0.0.0/8"}})
	o1 := startConnOrigin(t, "one", "127.0.0.1:0", false)
	pt := port(t, o1.Server)
	o2 := startConnOrigin(t, "two", "127.0.0.2:"+pt, false)
	h.p.ports[uint16(mustAtoi(pt))] = true
	c := h.client(false)
	u := "http://name.test:" + pt + "/"

	h.res.set("name.test", "127.0.0.1")
	for i := 0; i < 3; i++ {
		if resp, body := get(t, c, u); resp.Header.Get("X-Origin") != "one" {
			t.Fatalf("request %d: %d %q, want origin one", i, resp.StatusCode, body)
		}
	}
	if n := o1.opened.Load(); n != 1 {
		t.Errorf("origin one saw %d connections for 3 requests, want 1 (pooled)", n)
	}

	h.res.set("name.test", "127.0.0.2")
	if resp, body := get(t, c, u); resp.Header.Get("X-Origin") != "two" {
		t.Errorf("after the name moved to 127.0.0.2: %d %q came from origin %q, want two: a connection to the old address was reused",
			resp.StatusCode, body, resp.Header.Get("X-Origin"))
	}

	h.res.set("name.test", "10.1.2.3")
	resp, body := get(t, c, u)
	h.checkNameRefusal(t, resp, body, "private", "name.test")
	if n := o1.opened.Load() + o2.opened.Load(); n != 2 {
		t.Errorf("origins saw %d connections, want 2", n)
	}

	so := startConnOrigin(t, "tls", "", true)
	spt := port(t, so.Server)
	h.p.ports[uint16(mustAtoi(spt))] = true
	h.res.set("a.test", "127.0.0.1")
	h.res.set("b.test", "127.0.0.1")
	tc := h.client(false)
	for _, n := range []string{"a.test", "a.test", "b.test", "b.test"} {
		if resp, body := get(t, tc, "https://"+n+":"+spt+"/"); resp.StatusCode != 200 || body != "tls "+n+":"+spt+"\n" {
			t.Fatalf("%s: %d %q", n, resp.StatusCode, body)
		}
	}
	if got := so.names(); len(got) != 2 || got[0] != "a.test" || got[1] != "b.test" {
		t.Errorf("origin handshakes named %v, want [a.test b.test]: one TLS connection per verified name, reused for that name only", got)
	}
}

// TestPooledConnectionsClosedOnRevocation: when a name stops being
// allowed, the idle upstream connections kept for it are closed (HTTP/1.1
// and HTTP/2 alike), while those of a name still allowed stay open.
func TestPooledConnectionsClosedOnRevocation(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"gone.test", "kept.test", "h2gone.test"}})
	gone := startConnOrigin(t, "gone", "", false)
	kept := startConnOrigin(t, "kept", "", false)
	h2o := startOrigin(t, "h2", "", true, true)
	h2open, h2closed := &h2o.opened, &h2o.closed
	h.allowOrigin("gone.test", gone, port(t, gone.Server))
	h.allowOrigin("kept.test", kept, port(t, kept.Server))
	h.allowOrigin("h2gone.test", h2o, port(t, h2o.Server))
	c := h.client(false)
	for _, u := range []string{"http://gone.test:" + port(t, gone.Server) + "/", "http://kept.test:" + port(t, kept.Server) + "/"} {
		if resp, body := get(t, c, u); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %q", u, resp.StatusCode, body)
		}
	}
	resp, body := get(t, c, "https://h2gone.test:"+port(t, h2o.Server)+"/")
	if resp.StatusCode != 200 || resp.Header.Get("X-Proto") != "HTTP/2.0" {
		t.Fatalf("h2gone: %d %q over %q, want 200 over HTTP/2.0", resp.StatusCode, body, resp.Header.Get("X-Proto"))
	}
	// Only the pool holds the origins' connections now.
	c.CloseIdleConnections()
	if gone.opened.Load() != 1 || kept.opened.Load() != 1 || h2open.Load() != 1 {
		t.Fatalf("connections opened: gone %d, kept %d, h2 %d; want one each", gone.opened.Load(), kept.opened.Load(), h2open.Load())
	}
	if _, err := h.engine.Remove("gone.test", "h2gone.test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gone.closed.Load() == 0 || h2closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("5s after the names were removed: gone's connection closed %d, h2 closed %d; want both closed", gone.closed.Load(), h2closed.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(poolSweepTicks * policyPoll) // a periodic sweep too
	if n := kept.closed.Load(); n != 0 {
		t.Errorf("the connection of a name still allowed was closed (%d)", n)
	}
	if resp, _ := get(t, c, "http://kept.test:"+port(t, kept.Server)+"/"); resp.StatusCode != 200 || kept.opened.Load() != 1 {
		t.Errorf("kept: %d, %d connections; want 200 on the pooled one", resp.StatusCode, kept.opened.Load())
	}
}

// TestInnerRequestsReuseConnectAddresses: requests inside an intercepted
// tunnel use the addresses the CONNECT checked instead of a lookup each,
// and are still decided by name: one removed from the allowlist is refused
// (the tunnel is closed) although its addresses were checked.
func TestInnerRequestsReuseConnectAddresses(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"pin.test"}})
	so := startConnOrigin(t, "pin", "", true)
	spt := port(t, so.Server)
	h.allowOrigin("pin.test", so, spt)
	c := h.client(false)
	for i := 0; i < 4; i++ {
		if resp, body := get(t, c, "https://pin.test:"+spt+"/"); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := h.res.count("pin.test"); n != 1 {
		t.Errorf("pin.test was looked up %d times for one tunnel and 4 requests, want 1", n)
	}
	if _, err := h.engine.Remove("pin.test"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := c.Get("https://pin.test:" + spt + "/")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil || resp.StatusCode == http.StatusForbidden {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d 5s after pin.test was removed", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestH2ConnectionLostIsRetried: a request without a body whose shared
// HTTP/2 connection went away under it is sent once more on a new one.
func TestH2ConnectionLostIsRetried(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"h2.test"}})
	o := startOrigin(t, "h2", "", true, true)
	pt := port(t, o.Server)
	h.allowOrigin("h2.test", o, pt)
	tg, err := egress.ParseAuthority("h2.test:"+pt, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := h.p.decide(context.Background(), tg, nil, nil)
	if d.checked == nil {
		t.Fatalf("decision %+v", d)
	}
	st := &fwdState{checked: d.checked, scheme: "https", defaultPort: 443, rec: &record{}}
	_, cc, _, err := h.p.dialUpstreamConn(context.Background(), st)
	if err != nil || cc == nil {
		t.Fatalf("dial: %v, h2 %v", err, cc != nil)
	}
	ctx := context.Background()
	req, _ := http.NewRequestWithContext(ctx, "GET", "https://h2.test:"+pt+"/", nil)
	resp, err := h.p.roundTripH2(ctx, req, st, cc)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cc.Close() // gone before the next request went out
	req, _ = http.NewRequestWithContext(ctx, "GET", "https://h2.test:"+pt+"/", nil)
	resp, err = h.p.roundTripH2(ctx, req, st, cc)
	if err != nil {
		t.Fatalf("round trip on a lost HTTP/2 connection: %v, want it sent again on a new one", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 || o.opened.Load() != 2 {
		t.Errorf("%d over %s, origin connections %d; want 200 over HTTP/2 on a second connection", resp.StatusCode, resp.Proto, o.opened.Load())
	}
}

// TestTrailersRelayed: trailers the origin sends after the body reach the
// guest, from an HTTP/1.1 origin and from an HTTP/2 one.
func TestTrailersRelayed(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("X-Proto", r.Proto)
		io.WriteString(w, "body")
		w.(http.Flusher).Flush()
		w.Header().Set("X-Sum", "42")
	})
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	plain := startOriginWith(t, "plain", "", false, false, mux)
	h2o := startOriginWith(t, "h2", "", true, true, mux)
	h.allowOrigin("origin.test", plain, port(t, plain.Server))
	h.p.ports[uint16(mustAtoi(port(t, h2o.Server)))] = true
	for _, tc := range []struct{ url, proto string }{
		{"http://origin.test:" + port(t, plain.Server) + "/", "HTTP/1.1"},
		{"https://origin.test:" + port(t, h2o.Server) + "/", "HTTP/2.0"},
	} {
		resp, err := h.client(false).Get(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "body" || resp.Trailer.Get("X-Sum") != "42" || resp.Header.Get("X-Proto") != tc.proto {
			t.Errorf("%s: body %q, trailer %v, upstream %s; want body, X-Sum 42 over %s", tc.url, b, resp.Trailer, resp.Header.Get("X-Proto"), tc.proto)
		}
	}
}
