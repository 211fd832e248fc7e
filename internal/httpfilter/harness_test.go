package httpfilter

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/abox-dev/abox/internal/egress"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// fakeResolver answers from a table; each name may have a sequence of
// answers (the last repeats), and every lookup is counted.
type fakeResolver struct {
	mu    sync.Mutex
	m     map[string][][]netip.Addr
	calls map[string]int
}

func newFakeResolver() *fakeResolver {
	return &fakeResolver{m: map[string][][]netip.Addr{}, calls: map[string]int{}}
}

func (f *fakeResolver) set(name string, answers ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var as []netip.Addr
	for _, a := range answers {
		as = append(as, netip.MustParseAddr(a))
	}
	f.m[name] = [][]netip.Addr{as}
}

func (f *fakeResolver) sequence(name string, seq ...[]netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.m[name] = seq
}

func (f *fakeResolver) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func (f *fakeResolver) LookupNetIP(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[host]++
	seq, ok := f.m[host]
	if !ok {
		return nil, fmt.Errorf("lookup %s: no such host", host)
	}
	i := min(f.calls[host]-1, len(seq)-1)
	return seq[i], nil
}

// syncBuffer collects decision-log lines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) lines() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

type hopts struct {
	allow      []string
	passive    bool
	noMITM     bool
	exceptions []string
	ports      []uint16
	maxConns   int
	idle       time.Duration
	handshake  time.Duration
	respHeader time.Duration
	permit     []string
	hostAddrs  []string
	dialer     *recordingDialer
	upDialer   egress.Dialer // Config.Dialer, when dialer is nil (a parent proxy)
	decisions  bool          // decision lines through a decisionlog.Writer (h.lines)
	// sink, when set, takes the decision lines instead of h.log (a
	// benchmark's io.Discard: a buffer growing to hundreds of MB would be
	// measured too).
	sink      io.Writer
	rate      float64      // Config.RequestRate (negative: no limit)
	keyLog    string       // Config.KeyLogPath, if not logs/keys.log in a temporary directory
	keyLogMax int64        // Config.KeyLogMaxBytes
	secrets   SecretSource // Config.Secrets
	// wrapListener, when set, wraps the proxy's listener (its accepted
	// connections are the guest's).
	wrapListener func(net.Listener) net.Listener
	resolver     interface {
		LookupNetIP(context.Context, string) ([]netip.Addr, error)
	}
}

type harness struct {
	t       testing.TB
	p       *Proxy
	addr    string
	res     *fakeResolver
	engine  *policy.Engine
	proxyCA *x509.CertPool
	origin  *ca.CA
	roots   *x509.CertPool
	log     *syncBuffer
	diag    *syncBuffer         // Config.Logger's lines
	kept    *syncBuffer         // the refusal stream of lines (hopts.decisions)
	lines   *decisionlog.Writer // set with hopts.decisions
	keyLog  string
	cancel  context.CancelFunc
	done    chan error
}

func newHarness(t testing.TB, o hopts) *harness {
	t.Helper()
	dir := t.TempDir()
	al := filepath.Join(dir, "allowlist.txt")
	if err := os.WriteFile(al, []byte(strings.Join(o.allow, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	eng, err := policy.New(policy.Config{AllowlistPath: al})
	if err != nil {
		t.Fatal(err)
	}
	if o.passive {
		eng.SetMode(policy.Passive)
	}
	proxyCA, err := ca.New(ca.Config{Dir: filepath.Join(dir, "ca")})
	if err != nil {
		t.Fatal(err)
	}
	originCA := testOriginCA(t)
	roots := x509.NewCertPool()
	oc, err := originCA.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	roots.AddCert(oc)
	if o.permit == nil {
		o.permit = []string{"127.0.0.1/32"}
	}
	var permit []netip.Prefix
	for _, s := range o.permit {
		permit = append(permit, netip.MustParsePrefix(s))
	}
	var host []netip.Addr
	for _, s := range o.hostAddrs {
		host = append(host, netip.MustParseAddr(s))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, res: newFakeResolver(), engine: eng, origin: originCA, roots: roots, log: &syncBuffer{}, diag: &syncBuffer{}, keyLog: filepath.Join(dir, "logs", "keys.log")}
	var sl net.Listener = ln
	if o.wrapListener != nil {
		sl = o.wrapListener(ln)
	}
	cfg := Config{
		Listener: sl,
		Logger:   slog.New(slog.NewJSONHandler(h.diag, nil)),
		Policy:   eng,
		Resolver: h.res,
		// The test upstreams listen on loopback: only --allow-host opens it.
		Addresses:        netclass.New(netclass.Options{PermitHost: permit, Host: host}),
		Ports:            o.ports,
		CA:               proxyCA,
		NoMITM:           o.noMITM,
		MITMExceptions:   o.exceptions,
		UpstreamRoots:    roots,
		KeyLogPath:       h.keyLog,
		KeyLogMaxBytes:   o.keyLogMax,
		DecisionLog:      slog.New(slog.NewJSONHandler(h.log, nil)),
		MaxConns:         o.maxConns,
		IdleTimeout:      o.idle,
		HandshakeTimeout: 5 * time.Second,
	}
	if o.handshake > 0 {
		cfg.HandshakeTimeout = o.handshake
	}
	if o.keyLog != "" {
		h.keyLog, cfg.KeyLogPath = o.keyLog, o.keyLog
	}
	cfg.ResponseHeaderTimeout = o.respHeader
	cfg.Secrets = o.secrets
	cfg.RequestRate = o.rate
	if o.resolver != nil {
		cfg.Resolver = o.resolver
	}
	if o.dialer != nil {
		cfg.Dialer = o.dialer
	} else if o.upDialer != nil {
		cfg.Dialer = o.upDialer
	}
	if o.decisions {
		h.kept = &syncBuffer{}
		var sink io.Writer = h.log
		if o.sink != nil {
			sink = o.sink
		}
		h.lines = decisionlog.New(decisionlog.Config{Sinks: []io.Writer{sink}, Kept: []io.Writer{h.kept}})
		t.Cleanup(func() { h.lines.Close() })
		cfg.Decisions = h.lines
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.p, h.addr = p, ln.Addr().String()
	pem, err := proxyCA.CertPEM()
	if err != nil {
		t.Fatal(err)
	}
	h.proxyCA = x509.NewCertPool()
	h.proxyCA.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- p.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			if err != nil {
				t.Errorf("Serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Serve did not return after cancel")
		}
	})
	return h
}

var (
	originCAOnce sync.Once
	originCAVal  *ca.CA
	originCADir  string
)

// testOriginCA is the "public internet" CA of the tests: it signs the
// HTTPS origins, and the proxy trusts it as its --upstream-ca.
func testOriginCA(t testing.TB) *ca.CA {
	originCAOnce.Do(func() {
		dir, err := os.MkdirTemp("", "abox-origin-ca-")
		if err != nil {
			panic(err)
		}
		originCADir = dir
		c, err := ca.New(ca.Config{Dir: dir, Name: "test origins"})
		if err != nil {
			panic(err)
		}
		originCAVal = c
	})
	return originCAVal
}

func TestMain(m *testing.M) {
	code := m.Run()
	if originCADir != "" {
		os.RemoveAll(originCADir)
	}
	os.Exit(code)
}

// client returns an http.Client that uses the proxy and trusts its CA.
func (h *harness) client(h2 bool) *http.Client {
	u, _ := url.Parse("http://" + h.addr)
	tr := &http.Transport{
		Proxy:             http.ProxyURL(u),
		TLSClientConfig:   &tls.Config{RootCAs: h.proxyCA},
		ForceAttemptHTTP2: h2,
		DisableKeepAlives: false,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	h.t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// lastLog returns the last decision-log line whose key k has value v.
func (h *harness) lastLog(k, v string) map[string]any {
	ls := h.log.lines()
	for i := len(ls) - 1; i >= 0; i-- {
		if fmt.Sprint(ls[i][k]) == v {
			return ls[i]
		}
	}
	return nil
}

// echo is the origins' default handler: it reports what arrived.
type echoReply struct {
	Method string      `json:"method"`
	Host   string      `json:"host"`
	Path   string      `json:"path"`
	Query  string      `json:"query"`
	Proto  string      `json:"proto"`
	Header http.Header `json:"header"`
	Body   int         `json:"body"`
}

func originMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Connection", "X-Hop-Resp")
		w.Header().Set("X-Hop-Resp", "secret")
		json.NewEncoder(w).Encode(echoReply{Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery, Proto: r.Proto, Header: r.Header, Body: int(n)})
	})
	return mux
}

func newHTTPOrigin(t *testing.T, mux http.Handler) *httptest.Server {
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func newHTTPSOrigin(t *testing.T, mux http.Handler) *httptest.Server {
	s := httptest.NewUnstartedServer(mux)
	oca := testOriginCA(t)
	s.TLS = &tls.Config{
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			name := h.ServerName
			if name == "" {
				name = "127.0.0.1"
			}
			return oca.Leaf(name)
		},
	}
	s.EnableHTTP2 = true
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func port(t *testing.T, s *httptest.Server) string {
	u, _ := url.Parse(s.URL)
	return u.Port()
}

// recordingDialer records every address dialled.
type recordingDialer struct {
	mu    sync.Mutex
	addrs []string
	d     net.Dialer
	// panics makes every dial panic (after it is recorded).
	panics bool
}

func (r *recordingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.addrs = append(r.addrs, addr)
	r.mu.Unlock()
	if r.panics {
		panic("injected by the test: dial")
	}
	return r.d.DialContext(ctx, network, addr)
}

func (r *recordingDialer) dialed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.addrs...)
}
