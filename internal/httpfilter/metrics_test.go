package httpfilter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/metrics"
)

// Each counter of the proxy counts what its name says, once per record.
func TestMetricsObserve(t *testing.T) {
	m := NewMetrics(metrics.New("dev"))
	for _, r := range []*record{
		{kind: "connect", mode: "tunnel", verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, up: 100, down: 2000},
		{kind: "connect", mode: "mitm", verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted},
		{kind: "inner", verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, ruleSet: "api.example", injected: "gh,npm", up: 10, down: 20},
		{kind: "inner", verdict: allowlist.Block, reason: "method_not_allowed", ruleSet: "api.example"},
		{kind: "http", verdict: allowlist.Block, reason: ReasonRateLimited},
		{kind: "odd", verdict: allowlist.Block, reason: allowlist.ReasonNotAllowlisted},
	} {
		m.observe(r)
	}
	for _, tt := range []struct {
		name string
		got  float64
		want float64
	}{
		{"tunnels allowed", testutil.ToFloat64(m.tunnels[0]), 1},
		{"tunnels refused", testutil.ToFloat64(m.tunnels[1]), 0},
		{"connect bytes up", testutil.ToFloat64(m.bytes[1][0]), 100},
		{"connect bytes down", testutil.ToFloat64(m.bytes[1][1]), 2000},
		{"inner bytes down", testutil.ToFloat64(m.bytes[2][1]), 20},
		{"rule hits allowed", testutil.ToFloat64(m.ruleHits[0]), 1},
		{"rule hits refused", testutil.ToFloat64(m.ruleHits[1]), 1},
		{"secret injections", testutil.ToFloat64(m.injections), 2},
		{"rate limited", testutil.ToFloat64(m.rateLimited), 1},
	} {
		if tt.got != tt.want {
			t.Errorf("%s = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
	var nilM *Metrics
	nilM.observe(&record{kind: "http"}) // metrics off: nothing, no panic
}
