package daemon

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

// TestNetworkSpecificNAT64Refused: on a network whose DNS64 resolver
// synthesises ipv4only.arpa under a network-specific prefix, the data plane
// learns that prefix, and an allowlisted name whose only address is under it
// embedding a private IPv4 address (what the NAT64 gateway would reach) is
// refused by the DNS filter (dns_rebinding) and by the proxy (private). The
// same prefix embedding a public address is answered.
func TestNetworkSpecificNAT64Refused(t *testing.T) {
	up := fakedns.StartT(t).Add(
		"ipv4only.arpa. 300 IN AAAA 2a01:4f8:c2c:123f:64:0:c000:aa",
		"ipv4only.arpa. 300 IN AAAA 2a01:4f8:c2c:123f:64:0:c000:ab",
		"lan.allowed.test. 300 IN AAAA 2a01:4f8:c2c:123f:64:0:a00:5",
		"web.allowed.test. 300 IN AAAA 2a01:4f8:c2c:123f:64:0:808:808",
	)
	dir := t.TempDir()
	allow := filepath.Join(dir, "allow.txt")
	if err := os.WriteFile(allow, []byte("*.allowed.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan Info, 1), make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Instance: "t", AllowlistPath: allow, APISocket: filepath.Join(dir, "api.sock"),
			Upstreams: []string{up.Addr},
			DNS:       &DNSConfig{Listen: "127.0.0.1:0", RateLimit: -1},
			HTTP:      &HTTPConfig{Listen: "127.0.0.1:0", Ports: []uint16{80}, CADir: filepath.Join(dir, "ca")},
			Ready:     func(i Info) { ready <- i },
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	var info Info
	select {
	case info = <-ready:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	ask := func(name string) *dns.Msg {
		r, _, err := (&dns.Client{Timeout: 30 * time.Second}).Exchange(new(dns.Msg).SetQuestion(name, dns.TypeAAAA), info.DNSAddr.String())
		if err != nil {
			t.Fatalf("query %s: %v", name, err)
		}
		return r
	}
	// Discovery runs in the background from the start.
	var r *dns.Msg
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r = ask("lan.allowed.test."); r.Rcode == dns.RcodeNameError {
			break
		}
	}
	if r.Rcode != dns.RcodeNameError || len(r.Answer) != 0 {
		t.Errorf("AAAA under the NAT64 prefix embedding 10.0.0.5: %s %v, want NXDOMAIN", dns.RcodeToString[r.Rcode], r.Answer)
	}
	if r := ask("web.allowed.test."); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("AAAA under the NAT64 prefix embedding 8.8.8.8: %s %v, want the answer", dns.RcodeToString[r.Rcode], r.Answer)
	}
	proxy := &url.URL{Scheme: "http", Host: info.HTTPAddr.String()}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://lan.allowed.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// The guest is told forbidden_address; the proxy's log keeps "private".
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != "forbidden_address" {
		t.Errorf("proxy: %d %s, want 403 forbidden_address", resp.StatusCode, resp.Header.Get("X-Abox-Reason"))
	}
}

// TestLookupNAT64: the prefixes come from what the ipv4only.arpa answer
// embeds; no DNS64 (NXDOMAIN) means none, and no answer keeps them.
func TestLookupNAT64(t *testing.T) {
	up := fakedns.StartT(t).Add("ipv4only.arpa. 300 IN AAAA 2a01:4f8:c2c:123f:64:0:c000:aa")
	ex := newTestUpstream(t, up.Addr)
	ps, ok := lookupNAT64(context.Background(), ex)
	if !ok || len(ps) != 1 || ps[0] != netip.MustParsePrefix("2a01:4f8:c2c:123f:64::/96") {
		t.Errorf("lookupNAT64 = %v, %v, want [2a01:4f8:c2c:123f:64::/96]", ps, ok)
	}
	none := newTestUpstream(t, fakedns.StartT(t).Addr)
	if ps, ok := lookupNAT64(context.Background(), none); !ok || len(ps) != 0 {
		t.Errorf("without DNS64: %v, %v, want none, ok", ps, ok)
	}
}

func newTestUpstream(t *testing.T, addr string) *upstream.Client {
	t.Helper()
	c, err := upstream.New(upstream.Config{Servers: []string{addr}, Timeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
