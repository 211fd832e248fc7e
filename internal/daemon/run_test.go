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
}

func startPlane(t *testing.T) *plane { return startPlaneDNS(t, DNSConfig{RateLimit: -1}) }

func startPlaneDNS(t *testing.T, dc DNSConfig) *plane {
	t.Helper()
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "origin") }))
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
	p := &plane{up: up, allow: filepath.Join(dir, "allow.txt"), port: port}
	if err := os.WriteFile(p.allow, []byte("allowed.test\n*.tunnel.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	dc.Listen = "127.0.0.1:0"
	sock := filepath.Join(dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Info, 1)
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Instance: "t", AllowlistPath: p.allow, APISocket: sock,
			Upstreams: []string{up.Addr},
			AllowHost: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
			DNS:       &dc,
			HTTP:      &HTTPConfig{Listen: "127.0.0.1:0", Ports: []uint16{uint16(n)}, CADir: filepath.Join(dir, "ca")},
			Ready:     func(i Info) { ready <- i },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
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
	r, _, err := (&dns.Client{Timeout: 2 * time.Second}).Exchange(new(dns.Msg).SetQuestion(name, dns.TypeA), p.info.DNSAddr.String())
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return r.Rcode
}

func (p *plane) get(t *testing.T, host string) int {
	t.Helper()
	proxy := &url.URL{Scheme: "http", Host: p.info.HTTPAddr.String()}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, p.port) + "/")
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
	p := startPlaneDNS(t, DNSConfig{RateLimit: 0.001, RateBurst: 4})
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
