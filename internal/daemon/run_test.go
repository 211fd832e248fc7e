package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
)

// plane runs a whole data plane (both filters, one resolver) on loopback.
type plane struct {
	info  Info
	up    *fakedns.Server
	api   *api.Client
	allow string
	port  string // the origin's port
	// unblock releases the origin's /block requests; arrived receives one
	// value as each reaches the origin.
	unblock chan struct{}
	arrived chan struct{}
	// stop ends the plane and waits for Run to return (once; also at
	// cleanup).
	stop func()
}

func startPlane(t *testing.T) *plane {
	return startPlaneWith(t, DNSConfig{RateLimit: -1}, HTTPConfig{})
}

func startPlaneDNS(t *testing.T, dc DNSConfig) *plane { return startPlaneWith(t, dc, HTTPConfig{}) }

// startPlaneWith runs a data plane with dc and hc (addresses, ports and CA
// are filled in). The origin's /block waits until the plane's unblock is
// closed.
func startPlaneWith(t *testing.T, dc DNSConfig, hc HTTPConfig) *plane {
	t.Helper()
	return startPlaneLogs(t, dc, hc, LogConfig{})
}

// startPlaneLogs is startPlaneWith with the logging lc.
func startPlaneLogs(t *testing.T, dc DNSConfig, hc HTTPConfig, lc LogConfig) *plane {
	t.Helper()
	return startPlaneConfig(t, dc, hc, lc, nil)
}

// startPlaneConfig is startPlaneLogs with mod, when not nil, applied to
// the Config last.
func startPlaneConfig(t *testing.T, dc DNSConfig, hc HTTPConfig, lc LogConfig, mod func(*Config)) *plane {
	t.Helper()
	unblock, arrived := make(chan struct{}), make(chan struct{}, 8)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			arrived <- struct{}{}
			<-unblock
		}
		io.WriteString(w, "origin")
	}))
	t.Cleanup(func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	})
	t.Cleanup(origin.Close)
	_, port, _ := net.SplitHostPort(origin.Listener.Addr().String())
	up := fakedns.StartT(t).Add("allowed.test. 300 IN A 127.0.0.1")
	for i := range 10 {
		up.Add(fmt.Sprintf("t%d.tunnel.test. 300 IN A 127.0.0.1", i))
	}
	dir, err := os.MkdirTemp("", "aboxd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &plane{up: up, allow: filepath.Join(dir, "allow.txt"), port: port, unblock: unblock, arrived: arrived}
	if err := os.WriteFile(p.allow, []byte("allowed.test\n*.tunnel.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	dc.Listen = "127.0.0.1:0"
	hc.Listen, hc.Ports, hc.CADir = "127.0.0.1:0", []uint16{uint16(n)}, filepath.Join(dir, "ca")
	sock := filepath.Join(dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	cfg := Config{
		Instance: "t", AllowlistPath: p.allow, APISocket: sock,
		Upstreams: []string{up.Addr},
		AllowHost: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		DNS:       &dc,
		HTTP:      &hc,
		Logs:      lc,
		Ready:     func(i Info) { ready <- i },
	}
	if mod != nil {
		mod(&cfg)
	}
	go func() { done <- Run(ctx, cfg) }()
	var stopOnce sync.Once
	p.stop = func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(p.stop)
	select {
	case p.info = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	p.api = api.NewClient(sock)
	return p
}

func (p *plane) query(t *testing.T, name string) int {
	t.Helper()
	r, _, err := (&dns.Client{Timeout: 30 * time.Second}).Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), p.info.DNSAddr.String())
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r.Rcode
}

func (p *plane) get(t *testing.T, host string) int { return p.getPath(t, host, "/") }

func (p *plane) getPath(t *testing.T, host, path string) int {
	t.Helper()
	proxy := &url.URL{Scheme: "http", Host: p.info.HTTPAddr.String()}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, p.port) + path)
	if err != nil {
		t.Fatalf("GET through the proxy: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// aQueries counts the A queries the upstream saw for name.
func (p *plane) aQueries(name string) int {
	n := 0
	for _, q := range p.up.Queries() {
		if q.Msg.Question[0].Name == name && q.Msg.Question[0].Qtype == dns.TypeA {
			n++
		}
	}
	return n
}

// Both filters ask one resolver: the guest's DNS query fills the cache the
// proxy then uses, so the proxy's own lookups cost no second A query.
func TestFiltersShareOneResolver(t *testing.T) {
	p := startPlane(t)
	if rc := p.query(t, "allowed.test."); rc != dns.RcodeSuccess {
		t.Fatalf("query: rcode %s", dns.RcodeToString[rc])
	}
	for range 3 {
		if code := p.get(t, "allowed.test"); code != http.StatusOK {
			t.Fatalf("GET: %d, want 200", code)
		}
	}
	if got := p.aQueries("allowed.test."); got != 1 {
		t.Errorf("one DNS query and three proxied requests cost %d upstream A queries, want 1", got)
	}
	st, err := p.api.Status(context.Background())
	if err != nil || st.Components["resolver"] == nil {
		t.Errorf("API status has no resolver: %v, %v", st.Components, err)
	}
}

// A cached answer never outlives the policy: after the name leaves the
// allowlist, or after a switch back to active mode, neither filter serves it,
// although the resolver still holds it.
func TestCacheNeverServesWhatThePolicyRefuses(t *testing.T) {
	p := startPlane(t)
	ctx := context.Background()
	if p.query(t, "allowed.test.") != dns.RcodeSuccess || p.get(t, "allowed.test") != http.StatusOK {
		t.Fatal("allowed name not served")
	}
	if _, err := p.api.AllowlistRemove(ctx, []string{"allowed.test"}); err != nil {
		t.Fatalf("allowlist remove: %v", err)
	}
	if rc := p.query(t, "allowed.test."); rc != dns.RcodeNameError {
		t.Errorf("after removal: rcode %s, want NXDOMAIN", dns.RcodeToString[rc])
	}
	if code := p.get(t, "allowed.test"); code != http.StatusForbidden {
		t.Errorf("after removal: proxy answered %d, want 403", code)
	}

	// Passive mode allows every name; back in active mode the cache it
	// filled is not a way around the allowlist.
	if err := p.api.SetMode(ctx, policy.Passive); err != nil {
		t.Fatal(err)
	}
	if p.query(t, "allowed.test.") != dns.RcodeSuccess || p.get(t, "allowed.test") != http.StatusOK {
		t.Fatal("passive mode did not allow the name")
	}
	if err := p.api.SetMode(ctx, policy.Active); err != nil {
		t.Fatal(err)
	}
	if rc := p.query(t, "allowed.test."); rc != dns.RcodeNameError {
		t.Errorf("back in active mode: rcode %s, want NXDOMAIN", dns.RcodeToString[rc])
	}
	if code := p.get(t, "allowed.test"); code != http.StatusForbidden {
		t.Errorf("back in active mode: proxy answered %d, want 403", code)
	}
}

// The proxy's lookups are charged to the same per-guest budget as the
// guest's own DNS queries: resolving fresh names through the proxy (a DNS
// tunnel) stops at the guest's DNS rate, and spends what its DNS queries
// could have used.
func TestProxyLookupsShareTheGuestsDNSBudget(t *testing.T) {
	p := startPlaneDNS(t, DNSConfig{RateLimit: 0.001, RateBurst: 8}) // four lookups of two queries
	for i := range 4 {
		if code := p.get(t, fmt.Sprintf("t%d.tunnel.test", i)); code != http.StatusOK {
			t.Fatalf("request %d within the budget: %d", i, code)
		}
	}
	if code := p.get(t, "t4.tunnel.test"); code != http.StatusBadGateway {
		t.Errorf("a lookup over the guest's budget: proxy answered %d, want 502", code)
	}
	if rc := p.query(t, "allowed.test."); rc != dns.RcodeRefused {
		t.Errorf("a DNS query after the proxy spent the budget: rcode %s, want REFUSED", dns.RcodeToString[rc])
	}
}

// Each guest has a request rate at the proxy: past its burst, 429 with the
// reason; the requests within it are served.
func TestProxyRequestRatePerGuest(t *testing.T) {
	p := startPlaneWith(t, DNSConfig{RateLimit: -1}, HTTPConfig{RateLimit: 0.001, RateBurst: 3})
	for i := range 3 {
		if code := p.get(t, "allowed.test"); code != http.StatusOK {
			t.Fatalf("request %d within the burst: %d", i, code)
		}
	}
	if code := p.get(t, "allowed.test"); code != http.StatusTooManyRequests {
		t.Errorf("request past the burst: %d, want 429", code)
	}
}

// Requests forwarded upstream at once are capped for the whole proxy: with
// every slot taken, a further request is answered 503 instead of adding
// upstream work, and it is served again once a slot is free.
func TestProxyCapsConcurrentUpstreamWork(t *testing.T) {
	p := startPlaneWith(t, DNSConfig{RateLimit: -1}, HTTPConfig{MaxUpstream: 1})
	held := make(chan int, 1)
	go func() { held <- p.getPath(t, "allowed.test", "/block") }()
	select { // the first request holds the slot once it is at the origin
	case <-p.arrived:
	case code := <-held:
		t.Fatalf("the blocking request returned %d", code)
	}
	if code := p.get(t, "allowed.test"); code != http.StatusServiceUnavailable {
		t.Errorf("with the only upstream slot taken: %d, want 503", code)
	}
	close(p.unblock)
	if code := <-held; code != http.StatusOK {
		t.Errorf("the request holding the slot: %d, want 200", code)
	}
	if code := p.get(t, "allowed.test"); code != http.StatusOK {
		t.Errorf("after the slot was freed: %d, want 200", code)
	}
}
