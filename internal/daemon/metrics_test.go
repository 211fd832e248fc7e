package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/abox-dev/abox/internal/monitor"
)

// scrape parses the metrics the plane's API serves.
func (p *plane) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	text, err := p.api.Metrics(context.Background())
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	return parseMetrics(t, text)
}

func parseMetrics(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("parsing the metrics: %v\n%s", err, text)
	}
	return fams
}

// sample is the value of the series of family name whose labels include
// want (a histogram: its count), and whether there is one.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func wantSample(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := sample(fams, name, labels)
	if !ok {
		got = 0 // a series never counted is not exposed
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

// N allowed and M refused queries through the real DNS filter are exactly
// what a scrape counts: by instance, layer, verdict and reason, with the
// cache hits and the upstream lookups among them.
func TestMetricsCountDNSQueries(t *testing.T) {
	p := startPlaneConfig(t, DNSConfig{RateLimit: -1}, HTTPConfig{}, LogConfig{}, func(c *Config) { c.Restarts = 2 })
	const allowed, refused = 5, 3
	for range allowed {
		if rc := p.query(t, "allowed.test."); rc != dns.RcodeSuccess {
			t.Fatalf("allowed.test: rcode %s", dns.RcodeToString[rc])
		}
	}
	for range refused {
		if rc := p.query(t, "refused.test."); rc != dns.RcodeNameError {
			t.Fatalf("refused.test: rcode %s", dns.RcodeToString[rc])
		}
	}
	fams := p.scrape(t)
	dnsL := func(kv ...string) map[string]string {
		m := map[string]string{"instance": "t", "layer": "dns"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	wantSample(t, fams, "abox_dns_queries_total", dnsL("verdict", "allow", "reason", "allowlisted"), allowed)
	wantSample(t, fams, "abox_dns_queries_total", dnsL("verdict", "block", "reason", "not_allowlisted"), refused)
	// The first allowed query went upstream; the others were cached.
	wantSample(t, fams, "abox_dns_cache_hits_total", dnsL(), allowed-1)
	wantSample(t, fams, "abox_dns_upstream_seconds", dnsL(), 1)
	wantSample(t, fams, "abox_filter_restarts_total", map[string]string{"instance": "t", "layer": "daemon"}, 2)
	var total float64
	for _, m := range fams["abox_dns_queries_total"].GetMetric() {
		total += m.Counter.GetValue()
	}
	if total != allowed+refused {
		t.Errorf("abox_dns_queries_total sums to %v, want %d: a query was counted twice or not at all", total, allowed+refused)
	}
}

// A rate-limited client's queries are counted as refusals with their
// reason, and in the rate-limited counter, even past the lines the flood
// budget writes.
func TestMetricsCountRateLimited(t *testing.T) {
	p := startPlaneDNS(t, DNSConfig{RateLimit: 0.001, RateBurst: 2})
	const queries = 40 // past the flood budget of refusal lines (decisionlog.DefaultRefusalsPerClient)
	limited := 0
	for range queries {
		if p.query(t, "allowed.test.") == dns.RcodeRefused {
			limited++
		}
	}
	if limited != queries-2 {
		t.Fatalf("%d of %d queries refused, want %d (burst 2)", limited, queries, queries-2)
	}
	fams := p.scrape(t)
	wantSample(t, fams, "abox_dns_queries_total", map[string]string{"verdict": "block", "reason": "rate_limited"}, float64(limited))
	wantSample(t, fams, "abox_dns_rate_limited_total", map[string]string{"layer": "dns"}, float64(limited))
}

// The loopback listener serves the same metrics to a scraper.
func TestMetricsListener(t *testing.T) {
	p := startPlaneConfig(t, DNSConfig{RateLimit: -1}, HTTPConfig{}, LogConfig{}, func(c *Config) { c.MetricsListen = "127.0.0.1:0" })
	if p.info.MetricsAddr == nil {
		t.Fatal("Info.MetricsAddr is nil with MetricsListen set")
	}
	p.query(t, "refused.test.")
	resp, err := http.Get("http://" + p.info.MetricsAddr.String() + "/metrics")
	if err != nil {
		t.Fatalf("scraping the listener: %v", err)
	}
	defer resp.Body.Close()
	text, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("listener answered %s: %s", resp.Status, text)
	}
	wantSample(t, parseMetrics(t, text), "abox_dns_queries_total", map[string]string{"reason": "not_allowlisted"}, 1)
}

// A listener on anything but loopback is refused before anything is
// bound, with the reason and the fix.
func TestMetricsListenerRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:9153", "[::]:9153", "192.0.2.1:9153", "localhost:9153", "127.0.0.1"} {
		t.Run(addr, func(t *testing.T) {
			dir := t.TempDir()
			// Cancelled: a Run that got past the check returns at once
			// instead of serving.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err := Run(ctx, Config{
				// Paths in a directory of the test's: a Run that got
				// past the check would write nothing outside it.
				Instance: "t", AllowlistPath: filepath.Join(dir, "allow.txt"), APISocket: filepath.Join(dir, "api.sock"),
				DNS: &DNSConfig{Listen: "127.0.0.1:0"}, MetricsListen: addr,
			})
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("Run with MetricsListen %q: %v, want ErrConfig", addr, err)
			}
			if !strings.Contains(err.Error(), "loopback") || !strings.Contains(err.Error(), addr) {
				t.Errorf("error %q does not name the address and ask for loopback", err)
			}
		})
	}
	if _, err := ParseMetricsListen("[::1]:9153"); err != nil {
		t.Errorf("[::1]:9153: %v, want accepted", err)
	}
}

// N allowed and M refused requests through the real proxy are exactly what
// a scrape counts, with the bytes they carried.
func TestMetricsCountProxyRequests(t *testing.T) {
	p := startPlane(t)
	const allowed, refused = 4, 3
	for range allowed {
		if code := p.get(t, "allowed.test"); code != http.StatusOK {
			t.Fatalf("allowed.test: %d", code)
		}
	}
	for range refused {
		if code := p.get(t, "refused.test"); code != http.StatusForbidden {
			t.Fatalf("refused.test: %d", code)
		}
	}
	fams := p.scrape(t)
	httpL := map[string]string{"instance": "t", "layer": "http", "kind": "http"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range httpL {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	wantSample(t, fams, "abox_http_requests_total", with("verdict", "allow", "reason", "allowlisted"), allowed)
	wantSample(t, fams, "abox_http_requests_total", with("verdict", "block", "reason", "not_allowlisted"), refused)
	var total float64
	for _, m := range fams["abox_http_requests_total"].GetMetric() {
		total += m.Counter.GetValue()
	}
	if total != allowed+refused {
		t.Errorf("abox_http_requests_total sums to %v, want %d", total, allowed+refused)
	}
	// Each allowed response carried the origin's 6 bytes of body.
	if down, _ := sample(fams, "abox_http_bytes_total", with("direction", "down")); down < float64(allowed*len("origin")) {
		t.Errorf("bytes down = %v, want at least %d", down, allowed*len("origin"))
	}
}

// The supervisor's start count is read as it is written, and anything else
// is an error rather than a restart count of 0.
func TestStartsFromEnv(t *testing.T) {
	for _, tt := range []struct {
		env  string
		want int
		ok   bool
	}{{"", 0, true}, {"0", 0, true}, {"7", 7, true}, {"-1", 0, false}, {"x", 0, false}} {
		t.Setenv(EnvStarts, tt.env)
		n, err := StartsFromEnv()
		if (err == nil) != tt.ok || n != tt.want {
			t.Errorf("%s=%q: %d, %v; want %d, ok %v", EnvStarts, tt.env, n, err, tt.want, tt.ok)
		}
	}
}

// The monitor's counts, kept in its status file, are what a scrape shows;
// no file (the monitor is not running) shows none.
func TestMetricsMonitor(t *testing.T) {
	status := filepath.Join(t.TempDir(), "monitor.json")
	p := startPlaneConfig(t, DNSConfig{RateLimit: -1}, HTTPConfig{}, LogConfig{}, func(c *Config) { c.MonitorStatus = status })
	if _, ok := sample(p.scrape(t), "abox_monitor_events_total", nil); ok {
		t.Error("monitor events exposed without a status file")
	}
	b, _ := json.Marshal(monitor.Status{Connected: true, Events: 7, DroppedRate: 2, DroppedOversize: 1})
	if err := os.WriteFile(status, b, 0o600); err != nil {
		t.Fatal(err)
	}
	fams := p.scrape(t)
	mon := func(kv ...string) map[string]string {
		m := map[string]string{"instance": "t", "layer": "monitor"}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	wantSample(t, fams, "abox_monitor_events_total", mon(), 7)
	wantSample(t, fams, "abox_monitor_dropped_total", mon("reason", "rate"), 2)
	wantSample(t, fams, "abox_monitor_dropped_total", mon("reason", "oversize"), 1)
	wantSample(t, fams, "abox_monitor_dropped_total", mon("reason", "invalid"), 0)
}
