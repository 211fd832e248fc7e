package httpfilter

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// The fuzz target of the proxy as a whole: whatever bytes a guest writes
// on a connection to the proxy (plain absolute-form requests, pipelined,
// CONNECT tunnels carrying plain HTTP, bodies of every framing), every
// request that reaches an origin
//
//   - arrives on a connection to an address the proxy resolved for a name
//     the allowlist allows, on an allowed port;
//   - parses there as HTTP/1.1 (no framing the origin reads differently),
//     and names in its Host exactly that name and port;
//   - was allowed by a decision line for that host and port, inside a
//     tunnel only for the tunnel's own target (no request
//     smuggled in a body or behind a bad frame reaches the origin
//     undecided: the origin never sees more requests for a host than the
//     proxy logged as allowed for it);
//   - to a host with request rules, carries a request-target those rules
//     allow as the origin reads it, in the canonical form (no spelling of
//     a path reaches the origin as another path than the one decided).

// fuzzConn is the guest's side of a connection: the proxy reads the fuzz
// input and then EOF, and what it writes back is discarded.
// With hold set, the guest keeps the connection open once its bytes are
// read (drained is closed then) until Close.
type fuzzConn struct {
	r           *bytes.Reader
	once, drain sync.Once
	closed      chan struct{}
	hold        bool
	drained     chan struct{}
}

func newFuzzConn(b []byte) *fuzzConn {
	return &fuzzConn{r: bytes.NewReader(b), closed: make(chan struct{}), drained: make(chan struct{})}
}

func (c *fuzzConn) Read(b []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	if c.r.Len() == 0 {
		c.drain.Do(func() { close(c.drained) })
		if c.hold {
			<-c.closed
			return 0, net.ErrClosed
		}
	}
	return c.r.Read(b)
}

func (c *fuzzConn) Write(b []byte) (int, error) {
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	return len(b), nil
}

func (c *fuzzConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *fuzzConn) LocalAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, 0, 2, 1), Port: 3128}
}
func (c *fuzzConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(192, 0, 2, 10), Port: 40000}
}
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// chanListener hands the proxy the connections sent on ch.
type chanListener struct {
	ch   chan net.Conn
	once sync.Once
	done chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(10, 0, 2, 1), Port: 3128} }

// originReq is one request as an origin read it.
type originReq struct {
	dialed netip.AddrPort
	host   string // Request.Host
	method string
	target string   // the request-target as the origin read it
	ext    []uint16 // a ClientHello's extensions (serveHellos)
	err    error    // the request did not parse
	bad    string   // a field the proxy must never forward (forwardedWrongly)
}

// forwardedWrongly names a field of h the proxy must not have forwarded:
// a routing field (isRoutingField), or in a trailer one a trailer may not
// carry.
func forwardedWrongly(h http.Header, trailer bool) string {
	for k := range h {
		if isRoutingField(k) || trailer && !httpguts.ValidTrailerHeader(k) {
			return k
		}
	}
	return ""
}

// fuzzOrigins is the resolver, the dialer and every origin: each name
// resolved gets an address of its own (public, so the guard lets it
// through), each dial an in-memory origin that records what it reads.
type fuzzOrigins struct {
	mu    sync.Mutex
	names map[string]netip.Addr
	addrs map[netip.Addr]string
	dials []netip.AddrPort
	reqs  []originReq
	open  sync.WaitGroup // origin connections not yet closed
	// tls makes every origin a TLS server's first steps (serveHellos)
	// instead of an HTTP/1.1 server; hrr makes it answer the first hello
	// with a HelloRetryRequest.
	tls, hrr bool
}

func (o *fuzzOrigins) LookupNetIP(_ context.Context, host string) ([]netip.Addr, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a, ok := o.names[host]
	if !ok {
		n := len(o.names) + 1
		a = netip.AddrFrom4([4]byte{93, 184, byte(n >> 8), byte(n)})
		o.names[host], o.addrs[a] = a, host
	}
	return []netip.Addr{a}, nil
}

func (o *fuzzOrigins) DialContext(_ context.Context, _, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %q: %w", addr, err)
	}
	o.mu.Lock()
	o.dials = append(o.dials, ap)
	o.mu.Unlock()
	proxySide, originSide := net.Pipe()
	o.open.Add(1)
	tlsOrigin, hrr := o.tls, o.hrr
	go func() {
		defer o.open.Done()
		if tlsOrigin {
			o.serveHellos(originSide, ap, hrr)
			return
		}
		o.serve(originSide, ap)
	}()
	return proxySide, nil
}

// serve reads requests as an HTTP/1.1 origin does and answers each with a
// short 200, until the proxy closes the connection.
func (o *fuzzOrigins) serve(c net.Conn, ap netip.AddrPort) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.ErrClosedPipe) {
				o.record(originReq{dialed: ap, err: err})
			}
			return
		}
		o.record(originReq{dialed: ap, host: req.Host, method: req.Method, target: req.RequestURI, bad: forwardedWrongly(req.Header, false)})
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.ErrClosedPipe) && !errors.Is(err, io.EOF) {
				o.record(originReq{dialed: ap, err: fmt.Errorf("request body: %w", err)})
			}
			return
		}
		if f := forwardedWrongly(req.Trailer, true); f != "" {
			o.record(originReq{dialed: ap, host: req.Host, bad: "trailer " + f})
		}
		answer := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
		if req.Method == http.MethodHead {
			answer = strings.TrimSuffix(answer, "ok") // no body, whatever the length says
		}
		if _, err := io.WriteString(c, answer); err != nil {
			return
		}
		if req.Close {
			return
		}
	}
}

func (o *fuzzOrigins) record(r originReq) {
	o.mu.Lock()
	o.reqs = append(o.reqs, r)
	o.mu.Unlock()
}

// count is the number of requests the origins have read so far.
func (o *fuzzOrigins) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.reqs)
}

func (o *fuzzOrigins) take() (dials []netip.AddrPort, reqs []originReq) {
	o.mu.Lock()
	defer o.mu.Unlock()
	dials, reqs = o.dials, o.reqs
	o.dials, o.reqs = nil, nil
	return dials, reqs
}

func (o *fuzzOrigins) nameOf(a netip.Addr) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.addrs[a]
}

// fuzzAllowlist: allowed.test (the HTTP/2 target too) and rules.test have
// request rules, names under ok.test none.
const fuzzAllowlist = `allowed.test GET,HEAD /**
allowed.test POST /up
allowed.test PUT /trial/** audit
*.ok.test
rules.test GET,HEAD /repos/acme/**
rules.test POST /repos/acme/app/pulls
rules.test GET /search?q=x
`

// fuzzProxy is a proxy serving connections handed to it in memory.
type fuzzProxy struct {
	p       *Proxy
	ln      *chanListener
	origins *fuzzOrigins
	engine  *policy.Engine
	log     *syncBuffer
	// diag is the proxy's own log (a contained panic's stack), panics the
	// count of contained panics already reported.
	diag   *syncBuffer
	panics uint64
}

func newFuzzProxy(t testing.TB, noMITM bool) *fuzzProxy {
	dir := t.TempDir()
	al := filepath.Join(dir, "allowlist.txt")
	list := fuzzAllowlist
	if noMITM {
		list = "allowed.test\n*.ok.test\n" // rules on a tunnel are refused
	}
	if err := os.WriteFile(al, []byte(list), 0o644); err != nil {
		t.Fatal(err)
	}
	eng, err := policy.New(policy.Config{AllowlistPath: al})
	if err != nil {
		t.Fatal(err)
	}
	proxyCA, err := ca.New(ca.Config{Dir: filepath.Join(dir, "ca")})
	if err != nil {
		t.Fatal(err)
	}
	fp := &fuzzProxy{
		ln:      &chanListener{ch: make(chan net.Conn), done: make(chan struct{})},
		origins: &fuzzOrigins{names: map[string]netip.Addr{}, addrs: map[netip.Addr]string{}, tls: noMITM},
		engine:  eng,
		log:     &syncBuffer{},
		diag:    &syncBuffer{},
	}
	// A tunnel's guest sends its bytes and EOF and its origin answers each
	// hello at once, so no input may leave a tunnel waiting on a timer:
	// with an hour to read a hello, one that waits is still open when
	// run's watchdog fires and fails with its input, where 2 s would only
	// have slowed the fuzzer.
	handshake := 2 * time.Second
	if noMITM {
		handshake = time.Hour
	}
	fp.p, err = New(Config{
		Listener:         fp.ln,
		Policy:           eng,
		Resolver:         fp.origins,
		Dialer:           fp.origins,
		Addresses:        netclass.New(netclass.Options{}),
		CA:               proxyCA,
		NoMITM:           noMITM,
		DecisionLog:      slog.New(slog.NewJSONHandler(fp.log, nil)),
		Logger:           slog.New(slog.NewTextHandler(fp.diag, nil)),
		RequestRate:      -1,
		HandshakeTimeout: handshake,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fp.p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return fp
}

// run serves one guest connection carrying b to its end and returns what
// the origins were asked and the decision lines.
func (fp *fuzzProxy) run(t *testing.T, b []byte) (dials []netip.AddrPort, reqs []originReq, lines string) {
	c := newFuzzConn(b)
	fp.ln.ch <- c
	select {
	case <-c.closed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the proxy still holds a connection whose guest sent %q and EOF", b)
	}
	return fp.collect(t, b)
}

// collect waits for the upstream exchanges of a guest connection that has
// ended and returns what the origins were asked and the decision lines.
func (fp *fuzzProxy) collect(t *testing.T, b []byte) (dials []netip.AddrPort, reqs []originReq, lines string) {
	// Every upstream exchange of this connection is over once the pool's
	// idle connections are closed and every origin has seen its end: only
	// then is what the origins read this connection's doing alone.
	fp.p.pool.CloseIdle()
	quiet := make(chan struct{})
	go func() {
		fp.origins.open.Wait()
		close(quiet)
	}()
	select {
	case <-quiet:
	case <-time.After(20 * time.Second):
		t.Fatalf("an upstream connection is still open after the guest that sent %q left", b)
	}
	// The proxy contains a panic to the connection it served (and logs
	// it): for the fuzzer it is a failure all the same.
	if n := fp.p.panics.Count(); n != fp.panics {
		fp.panics = n
		fp.diag.mu.Lock()
		diag := fp.diag.b.String()
		fp.diag.mu.Unlock()
		t.Fatalf("guest bytes %q: serving them panicked (contained):\n%s", b, diag)
	}
	dials, reqs = fp.origins.take()
	fp.log.mu.Lock()
	lines = fp.log.b.String()
	fp.log.b.Reset()
	fp.log.mu.Unlock()
	fp.checkDials(t, b, dials)
	return dials, reqs, lines
}

// checkDials: every address dialled was resolved for a name the policy
// allows, on an allowed port.
func (fp *fuzzProxy) checkDials(t *testing.T, b []byte, dials []netip.AddrPort) {
	for _, d := range dials {
		name := fp.origins.nameOf(d.Addr())
		if name == "" {
			t.Fatalf("guest bytes %q: dialled %s, an address no allowed name resolved to", b, d)
		}
		if dec := fp.engine.Decide(name); dec.Verdict != allowlist.Allow {
			t.Fatalf("guest bytes %q: dialled %s for %s, which the policy blocks (%s)", b, d, name, dec.Reason)
		}
		if d.Port() != 80 && d.Port() != 443 {
			t.Fatalf("guest bytes %q: dialled port %d", b, d.Port())
		}
	}
}

// serve runs one guest connection carrying b to its end and checks what
// reached the origins.
func (fp *fuzzProxy) serve(t *testing.T, b []byte) {
	_, reqs, lines := fp.run(t, b)
	fp.checkRequests(t, b, reqs, lines)
}

// checkRequests: every request an origin read was allowed for its host and
// port by a decision line (inside a tunnel only for the tunnel's target),
// parsed, and names that host and port.
func (fp *fuzzProxy) checkRequests(t *testing.T, b []byte, reqs []originReq, lines string) {
	allowed := map[string]int{} // host:port -> allow lines
	parsed := &syncBuffer{}
	parsed.Write([]byte(lines))
	for _, l := range parsed.lines() {
		if l["verdict"] != string(allowlist.Allow) || l["reason"] == policy.ReasonHealthcheck {
			continue
		}
		hp := fmt.Sprintf("%v:%v", l["host"], l["port"])
		switch l["kind"] {
		case "inner":
			// A tunnel's requests are held to its CONNECT target.
			if hp != l["connect"] {
				t.Fatalf("guest bytes %q: an inner request to %s allowed in the tunnel to %v", b, hp, l["connect"])
			}
			allowed[hp]++
		case "http":
			allowed[hp]++
		}
	}
	seen := map[string]int{}
	for _, r := range reqs {
		if r.err != nil {
			t.Fatalf("guest bytes %q: the origin at %s could not read what the proxy sent: %v", b, r.dialed, r.err)
		}
		if r.bad != "" {
			t.Fatalf("guest bytes %q: the origin at %s received %s", b, r.dialed, r.bad)
		}
		name := fp.origins.nameOf(r.dialed.Addr())
		ht, err := egress.ParseAuthority(r.host, 80)
		if err != nil || ht.Name != name || ht.Port != r.dialed.Port() {
			t.Fatalf("guest bytes %q: a request to %s (%s) names Host %q", b, r.dialed, name, r.host)
		}
		fp.checkRules(t, b, name, r)
		key := name + ":" + strconv.Itoa(int(r.dialed.Port()))
		if seen[key]++; seen[key] > allowed[key] {
			t.Fatalf("guest bytes %q: the origin %s read %d requests, the proxy allowed %d:\n%s", b, key, seen[key], allowed[key], lines)
		}
	}
}

// checkRules: a request an origin read for a host with rules is one the
// rules allow as the origin read it, and in the canonical form, so the
// path the origin acts on is the path that was decided.
func (fp *fuzzProxy) checkRules(t *testing.T, b []byte, name string, r originReq) {
	l := fp.engine.List()
	set := l.Rules(l.MatchNormalized(name).Rule)
	if set == nil {
		return
	}
	path, query := SplitTarget(r.target)
	if d, _ := set.Check(r.method, path, query); !d.Allowed {
		t.Fatalf("guest bytes %q: the origin %s read %s %s, which its rules refuse (%s)", b, name, r.method, r.target, d.Reason)
	}
	if c, err := reqrules.Normalize(path); err != nil || c != path {
		t.Fatalf("guest bytes %q: the origin %s read the path %q, not the canonical form %q (%v)", b, name, path, c, err)
	}
}

// proxySeeds are guest byte streams of every shape the proxy serves.
var proxySeeds = []string{
	"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
	"GET http://allowed.test/a HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	"POST http://x.ok.test/ HTTP/1.1\r\nHost: x.ok.test\r\nContent-Length: 37\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n\r\n",
	"POST http://x.ok.test/ HTTP/1.1\r\nHost: x.ok.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET http://allowed.test:443/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
	"POST http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET http://evil.test/ HTTP/1.1\r\n\r\n",
	"GET http://allowed.test/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\nHEAD http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
	"CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test:443\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nPOST /x HTTP/1.1\r\nHost: a.ok.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
	"CONNECT evil.test:443 HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n",
	"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
	"GET http://healthcheck.abox.local/ HTTP/1.1\r\nHost: healthcheck.abox.local\r\n\r\nGET http://93.184.0.1/ HTTP/1.1\r\nHost: 93.184.0.1\r\n\r\n",
	"GET http://ALLOWED.test./%2e%2e HTTP/1.1\r\nHost: allowed.test\r\nTE: trailers\r\nConnection: x-secret\r\nX-Secret: 1\r\n\r\n",
	"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nForwarded: host=evil.test\r\nX-Forwarded-Host: evil.test\r\nX-Host: evil.test\r\n\r\n",
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nHost: a.ok.test\r\nTrailer: Host, X-Original-Host, X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nHost: evil.test\r\nX-Original-Host: evil.test\r\nX-Sum: 1\r\n\r\n",
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nPOST / HTTP/1.1\r\nHost: a.ok.test\r\nTrailer: X-Sum\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n",
	// An opaque request-target naming another host (RFC 9112 3.2.2: an
	// origin that routes by the target's authority would serve evil.test).
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nGET http:https://evil.test/ HTTP/1.1\r\nHost: a.ok.test\r\n\r\n",
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nPOST http:http://evil.test/x HTTP/1.1\r\nHost: a.ok.test\r\nContent-Length: 2\r\n\r\nhi",
	"CONNECT a.ok.test:80 HTTP/1.1\r\n\r\nGET http://a.ok.test/ HTTP/1.1\r\nHost: a.ok.test\r\n\r\nOPTIONS * HTTP/1.1\r\nHost: a.ok.test\r\n\r\n",
	// Request rules: escapes of a rule refused, spellings canonicalised.
	"GET http://rules.test/repos/acme/app HTTP/1.1\r\nHost: rules.test\r\n\r\nGET http://rules.test/repos/acme%2fapp/../other HTTP/1.1\r\nHost: rules.test\r\n\r\n",
	"CONNECT rules.test:80 HTTP/1.1\r\n\r\nGET /repos/acme/x/%2e%2e/app HTTP/1.1\r\nHost: rules.test\r\n\r\nDELETE /repos/acme/app HTTP/1.1\r\nHost: rules.test\r\n\r\n",
	"GET http://rules.test//repos/acme/./app;v=1?q=1 HTTP/1.1\r\nHost: rules.test\r\n\r\nPOST http://rules.test/repos/acme/app/pulls HTTP/1.1\r\nHost: rules.test\r\nContent-Length: 0\r\n\r\nGET http://rules.test/search?%71=x HTTP/1.1\r\nHost: rules.test\r\n\r\n",
	"GET http://rules.test/repos/acme/..;/..;/x HTTP/1.1\r\nHost: rules.test\r\n\r\nGET http://rules.test/search?q=y HTTP/1.1\r\nHost: rules.test\r\n\r\nPUT http://allowed.test/trial/x HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 0\r\n\r\n",
	"GET http://rules.test/ws HTTP/1.1\r\nHost: rules.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
}

func FuzzProxyH1(f *testing.F) {
	for _, s := range proxySeeds {
		f.Add([]byte(s))
	}
	fp := newFuzzProxy(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		fp.serve(t, b)
	})
}

// TestFuzzProxyReachesOrigins: the fuzz harness really forwards (an oracle
// over no request would prove nothing): the allowed requests of the seeds
// reach their origins, the others do not.
func TestFuzzProxyReachesOrigins(t *testing.T) {
	fp := newFuzzProxy(t, false)
	want := []int{1, 1, 1, 2, 0, 2, 1, 1, 0, 1, 0, 1, 1, 1, 1, 0, 0, 2, 1, 1, 3, 1, 0}
	for i, s := range proxySeeds {
		c := newFuzzConn([]byte(s))
		fp.ln.ch <- c
		<-c.closed
		fp.p.pool.CloseIdle()
		fp.origins.open.Wait()
		_, reqs := fp.origins.take()
		if len(reqs) != want[i] {
			t.Errorf("seed %d %q: %d requests reached an origin, want %d: %+v", i, s, len(reqs), want[i], reqs)
		}
	}
}
