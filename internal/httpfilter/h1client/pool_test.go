package h1client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// key is a key as a policy would build one: a struct of what was checked.
type key struct {
	addr string
	tls  bool
}

// pipeConn is a Conn over one end of a net.Pipe (no socket: Alive looks
// only at buffered bytes); closed reports whether it was closed.
func pipeConn(t *testing.T) (u *Conn, peer net.Conn, closed *atomic.Bool) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	closed = new(atomic.Bool)
	raw := connio.NewIdleConn(a, time.Minute, func() { closed.Store(true) })
	u, cc, err := Open(context.Background(), raw, Options{ResponseHeaderTimeout: time.Minute})
	if err != nil || cc != nil {
		t.Fatalf("open: %v, h2 %v", err, cc != nil)
	}
	t.Cleanup(u.Close)
	return u, b, closed
}

// TestPoolReusesOnlyUnderItsKey: a connection put back under one key is
// found under that key alone, and once only.
func TestPoolReusesOnlyUnderItsKey(t *testing.T) {
	p := NewPool[key, string]()
	u, _, closed := pipeConn(t)
	k := key{addr: "192.0.2.1:443", tls: true}
	p.Put(k, "a.test", u)
	for _, other := range []key{{addr: "192.0.2.2:443", tls: true}, {addr: "192.0.2.1:443"}} {
		if got, _ := p.Get(other); got != nil {
			t.Fatalf("Get(%+v) returned the connection put under %+v", other, k)
		}
	}
	if got, _ := p.Get(k); got != u {
		t.Fatalf("Get(%+v) = %p, want the connection put under it (%p)", k, got, u)
	}
	if got, _ := p.Get(k); got != nil {
		t.Fatal("the connection was handed out twice")
	}
	if closed.Load() {
		t.Error("a connection handed out was closed")
	}
}

// TestPoolNeverHandsOutStale: Get closes, and does not return, a
// connection idle longer than IdleTimeout, one holding bytes nobody asked
// for, and one the origin closed; it returns one idle for IdleTimeout
// exactly.
func TestPoolNeverHandsOutStale(t *testing.T) {
	now := time.Unix(1e9, 0)
	p := NewPool[key, string]()
	p.now = func() time.Time { return now }
	k := key{addr: "192.0.2.1:80"}

	u, _, closed := pipeConn(t)
	p.Put(k, "", u)
	now = now.Add(IdleTimeout)
	if got, _ := p.Get(k); got != u {
		t.Fatalf("a connection idle for IdleTimeout exactly was not reused")
	}
	p.Put(k, "", u)
	now = now.Add(IdleTimeout + time.Nanosecond)
	if got, _ := p.Get(k); got != nil || !closed.Load() {
		t.Fatalf("idle past IdleTimeout: got %v, closed %v; want nil and closed", got != nil, closed.Load())
	}

	u, peer, closed := pipeConn(t)
	go io.WriteString(peer, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\n")
	if _, err := http.ReadResponse(u.BR, nil); err != nil {
		t.Fatal(err)
	}
	p.Put(k, "", u)
	if got, _ := p.Get(k); got != nil || !closed.Load() {
		t.Errorf("bytes past the last response: got %v, closed %v; want nil and closed", got != nil, closed.Load())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	var tcpClosed atomic.Bool
	u, _, err = Open(context.Background(), connio.NewIdleConn(c, time.Minute, func() { tcpClosed.Store(true) }), Options{ResponseHeaderTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	sc.Close()
	for deadline := time.Now().Add(5 * time.Second); u.Alive(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the origin's close never reached the socket")
		}
	}
	p.Put(k, "", u)
	if got, _ := p.Get(k); got != nil || !tcpClosed.Load() {
		t.Errorf("closed by the origin: got %v, closed %v; want nil and closed", got != nil, tcpClosed.Load())
	}
	if idle, _ := p.Held(); idle != 0 {
		t.Errorf("the pool counts %d idle connections, want 0", idle)
	}
}

// TestPoolBoundsIdle: past MaxIdlePerKey under one key, or MaxIdle in all,
// a connection put back is closed instead of kept.
func TestPoolBoundsIdle(t *testing.T) {
	p := NewPool[key, string]()
	one := key{addr: "192.0.2.1:80"}
	for range MaxIdlePerKey {
		u, _, _ := pipeConn(t)
		p.Put(one, "", u)
	}
	u, _, closed := pipeConn(t)
	p.Put(one, "", u)
	if !closed.Load() {
		t.Errorf("connection %d under one key was kept, want closed (MaxIdlePerKey %d)", MaxIdlePerKey+1, MaxIdlePerKey)
	}
	for i := MaxIdlePerKey; i < MaxIdle; i++ {
		u, _, _ := pipeConn(t)
		p.Put(key{addr: fmt.Sprintf("192.0.2.2:%d", i)}, "", u)
	}
	if idle, _ := p.Held(); idle != MaxIdle {
		t.Fatalf("held %d idle, want %d", idle, MaxIdle)
	}
	u, _, closed = pipeConn(t)
	p.Put(key{addr: "192.0.2.9:80"}, "", u)
	if !closed.Load() {
		t.Errorf("connection %d in all was kept, want closed (MaxIdle %d)", MaxIdle+1, MaxIdle)
	}
}

// TestPoolSweepByTag: Sweep closes the idle connections whose tag keep
// refuses, wherever they are kept, and leaves the others to be reused.
func TestPoolSweepByTag(t *testing.T) {
	p := NewPool[key, string]()
	type put struct {
		k      key
		tag    string
		u      *Conn
		closed *atomic.Bool
	}
	var puts []put
	for i, tag := range []string{"gone.test", "kept.test", "gone.test", "kept.test"} {
		u, _, closed := pipeConn(t)
		k := key{addr: fmt.Sprintf("192.0.2.%d:80", 1+i/2)} // two keys, each with both tags
		p.Put(k, tag, u)
		puts = append(puts, put{k, tag, u, closed})
	}
	p.Sweep(func(tag string) bool { return tag != "gone.test" })
	for _, e := range puts {
		if e.closed.Load() != (e.tag == "gone.test") {
			t.Errorf("%s under %v: closed %v after a sweep refusing gone.test", e.tag, e.k, e.closed.Load())
		}
	}
	if idle, _ := p.Held(); idle != 2 {
		t.Errorf("the pool counts %d idle connections after the sweep, want 2", idle)
	}
	for _, e := range puts {
		if e.tag != "kept.test" {
			continue
		}
		if got, _ := p.Get(e.k); got != e.u {
			t.Errorf("Get(%v) after the sweep: %p, want the kept connection %p", e.k, got, e.u)
		}
	}
	p.Put(puts[1].k, "kept.test", puts[1].u)
	p.CloseIdle()
	if !puts[1].closed.Load() {
		t.Error("CloseIdle left a connection open")
	}
}

// h2Origin is a TLS origin offering HTTP/2, and the client configuration
// that trusts it.
func h2Origin(t *testing.T) (*httptest.Server, *tls.Config) {
	t.Helper()
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto)
	}))
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	roots := x509.NewCertPool()
	roots.AddCert(s.Certificate())
	return s, &tls.Config{RootCAs: roots, ServerName: "example.com", NextProtos: []string{"h2", "http/1.1"}}
}

// openH2 opens a shared HTTP/2 connection to s and carries one request on
// it (a connection that never carried one is not idle yet).
func openH2(t *testing.T, s *httptest.Server, cfg *tls.Config) *http2.ClientConn {
	t.Helper()
	c, err := net.Dial("tcp", s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	u, cc, err := Open(context.Background(), connio.NewIdleConn(c, time.Minute, nil), Options{
		TLS: cfg.Clone(), HandshakeTimeout: time.Minute, ResponseHeaderTimeout: time.Minute, H2: &http2.Transport{IdleConnTimeout: time.Minute}, // LastIdle is kept only with an idle timeout
	})
	if err != nil || u != nil || cc == nil {
		t.Fatalf("open: %v; HTTP/1.1 %v, HTTP/2 %v; want HTTP/2", err, u != nil, cc != nil)
	}
	t.Cleanup(func() { cc.Close() })
	req, _ := http.NewRequest("GET", s.URL, nil)
	resp, err := cc.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "HTTP/2.0" {
		t.Fatalf("answered %q over the shared connection, want HTTP/2.0", b)
	}
	// The stream is forgotten, and the connection idle, just after its
	// body ends.
	for deadline := time.Now().Add(5 * time.Second); cc.State().LastIdle.IsZero(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection never became idle after its stream")
		}
	}
	return cc
}

// TestPoolH2: a shared HTTP/2 connection is found under its key before
// any idle HTTP/1.1 one; past the bound the one idle longest is closed for
// a new one; a sweep closes those whose tag it refuses.
func TestPoolH2(t *testing.T) {
	s, cfg := h2Origin(t)
	p := NewPool[key, string]()
	p.SetMaxH2(2)
	var ccs []*http2.ClientConn
	for i := range 3 {
		cc := openH2(t, s, cfg)
		p.AddH2(key{addr: fmt.Sprintf("192.0.2.%d:443", i), tls: true}, fmt.Sprintf("n%d.test", i), cc)
		ccs = append(ccs, cc)
	}
	if ev := p.H2Evicted(); ev != 1 {
		t.Fatalf("evicted %d adding 3 connections under a bound of 2, want 1", ev)
	}
	if !ccs[0].State().Closed || ccs[1].State().Closed || ccs[2].State().Closed {
		t.Fatalf("closed %v %v %v, want only the one idle longest (the first)", ccs[0].State().Closed, ccs[1].State().Closed, ccs[2].State().Closed)
	}
	if _, n := p.Held(); n != 2 {
		t.Fatalf("the pool counts %d HTTP/2 connections, want 2", n)
	}

	k := key{addr: "192.0.2.1:443", tls: true}
	u, _, _ := pipeConn(t)
	p.Put(k, "n1.test", u)
	if h1c, cc := p.Get(k); cc != ccs[1] || h1c != nil {
		t.Fatalf("Get(%v): HTTP/1.1 %v, HTTP/2 %p; want the shared connection %p", k, h1c != nil, cc, ccs[1])
	}
	if _, cc := p.Get(key{addr: "192.0.2.0:443", tls: true}); cc != nil {
		t.Fatal("Get returned a shared connection under the key of the evicted one")
	}

	p.Sweep(func(tag string) bool { return tag != "n2.test" })
	if !ccs[2].State().Closed || ccs[1].State().Closed {
		t.Errorf("after a sweep refusing n2.test: n1 closed %v, n2 closed %v; want only n2", ccs[1].State().Closed, ccs[2].State().Closed)
	}
	if _, n := p.Held(); n != 1 {
		t.Errorf("the pool counts %d HTTP/2 connections after the sweep, want 1", n)
	}
}
