package cli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/metrics"
)

// rigMetrics are the metrics controlRig's API serves: two refusals, one
// allowed query and one upstream lookup of 20 ms.
func rigMetrics() *metrics.Registry {
	reg := metrics.New("dev")
	q := reg.Decisions(metrics.LayerDNS, "abox_dns_queries_total", "DNS queries.").For()
	q.Inc("block", "not_allowlisted")
	q.Inc("block", "not_allowlisted")
	q.Inc("allow", "allowlisted")
	reg.Histogram(metrics.LayerDNS, "abox_dns_upstream_seconds", "Upstream time.", metrics.LatencyBuckets).Observe(0.02)
	return reg
}

func TestMetricsCommand(t *testing.T) {
	run, _ := controlRig(t)
	out, _, err := run("metrics", "dev")
	if err != nil {
		t.Fatalf("metrics dev: %v", err)
	}
	for _, want := range []string{
		`abox_dns_queries_total{instance="dev",layer="dns",reason="not_allowlisted",verdict="block"} 2`,
		`abox_dns_queries_total{instance="dev",layer="dns",reason="allowlisted",verdict="allow"} 1`,
		`abox_dns_upstream_seconds_bucket{instance="dev",layer="dns",le="0.025"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("metrics dev does not print %s:\n%s", want, out)
		}
	}

	out, _, err = run("metrics", "dev", "--json")
	if err != nil {
		t.Fatalf("metrics dev --json: %v", err)
	}
	var fams []metricFamily
	if err := json.Unmarshal([]byte(out), &fams); err != nil {
		t.Fatalf("metrics --json is not a list of families: %v\n%s", err, out)
	}
	got := map[string]metricSample{}
	for _, f := range fams {
		for _, s := range f.Samples {
			got[f.Name+"/"+s.Labels["verdict"]] = s
		}
	}
	if s := got["abox_dns_queries_total/block"]; s.Value == nil || *s.Value != 2 || s.Labels["reason"] != "not_allowlisted" || s.Labels["instance"] != "dev" {
		t.Errorf("refusals in JSON = %+v, want value 2 with their labels", s)
	}
	if s := got["abox_dns_upstream_seconds/"]; s.Count == nil || *s.Count != 1 || s.Buckets["0.025"] != 1 || s.Buckets["0.01"] != 0 {
		t.Errorf("histogram in JSON = %+v, want count 1 in the 0.025 bucket", s)
	}
}

func TestMetricsCommandNotRunning(t *testing.T) {
	run, _ := controlRig(t)
	_, _, err := run("metrics", "other")
	var h *hintError
	if err == nil || !errors.As(err, &h) || !strings.Contains(h.hint, "abox start other") {
		t.Fatalf("metrics of an instance that is not running = %v, want the hint to start it", err)
	}
	if _, _, err := run("metrics"); err == nil || !strings.Contains(err.Error(), "NAME") {
		t.Errorf("metrics without a name = %v, want a usage error naming NAME", err)
	}
}
