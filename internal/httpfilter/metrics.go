package httpfilter

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/metrics"
)

// Metrics are the proxy's Prometheus metrics (docs/metrics.md), built once
// per data plane by NewMetrics and given to New in Config.Metrics. Each is
// counted in observe, which finish calls once per decision line, so a
// scrape and the decision log count the same requests.
type Metrics struct {
	// requests are by record kind: http, connect, inner, then any other.
	requests [4]*metrics.Decisions
	// tunnels are CONNECTs carried as byte tunnels, by verdict: allow,
	// block.
	tunnels [2]prometheus.Counter
	// bytes are by kind (as requests) and direction: up, down.
	bytes       [4][2]prometheus.Counter
	ruleHits    [2]prometheus.Counter // by verdict: allow, block
	injections  prometheus.Counter
	rateLimited prometheus.Counter
}

// recordKinds are the values of the kind label, in the order of the
// arrays of Metrics.
var recordKinds = [4]string{"http", "connect", "inner", "other"}

// NewMetrics registers the proxy's metrics in r; nil for none.
func NewMetrics(r *metrics.Registry) *Metrics {
	if r == nil {
		return nil
	}
	m := &Metrics{}
	req := r.Decisions(metrics.LayerHTTP, "abox_http_requests_total",
		"Proxy decisions by record kind (http: a plain request or a refused CONNECT line; connect: a CONNECT; inner: a request inside an intercepted tunnel), verdict and reason code.", "kind")
	for i, k := range recordKinds {
		m.requests[i] = req.For(k)
	}
	copy(m.tunnels[:], r.CounterVec(metrics.LayerHTTP, "abox_http_tunnels_total",
		"CONNECTs carried as byte tunnels (not intercepted), by verdict.", "verdict", "allow", "block"))
	bytes := r.Family(metrics.LayerHTTP, "abox_http_bytes_total",
		"Bytes carried, by record kind and direction (up: guest to origin).", "kind", "direction")
	for i, k := range recordKinds {
		m.bytes[i] = [2]prometheus.Counter{bytes.Child(k, "up"), bytes.Child(k, "down")}
	}
	copy(m.ruleHits[:], r.CounterVec(metrics.LayerHTTP, "abox_http_request_rule_hits_total",
		"Requests decided by an entry's request rules (method and path), by verdict.", "verdict", "allow", "block"))
	m.injections = r.Counter(metrics.LayerHTTP, "abox_http_secret_injections_total",
		"Secrets set on requests going upstream (one per secret and request).")
	m.rateLimited = r.Counter(metrics.LayerHTTP, "abox_http_rate_limited_total",
		"Requests refused because their guest exceeded its request rate.")
	return m
}

func kindIndex(kind string) int {
	switch kind {
	case "http":
		return 0
	case "connect":
		return 1
	case "inner":
		return 2
	}
	return 3
}

func verdictIndex(v allowlist.Verdict) int {
	if v == allowlist.Allow {
		return 0
	}
	return 1
}

// observe counts r; a nil m counts nothing.
func (m *Metrics) observe(r *record) {
	if m == nil {
		return
	}
	k, v := kindIndex(r.kind), verdictIndex(r.verdict)
	m.requests[k].Inc(string(r.verdict), r.reason)
	if r.up > 0 {
		m.bytes[k][0].Add(float64(r.up))
	}
	if r.down > 0 {
		m.bytes[k][1].Add(float64(r.down))
	}
	if r.mode == "tunnel" {
		m.tunnels[v].Inc()
	}
	if r.ruleSet != "" {
		m.ruleHits[v].Inc()
	}
	if r.injected != "" {
		m.injections.Add(float64(strings.Count(r.injected, ",") + 1))
	}
	if r.reason == ReasonRateLimited {
		m.rateLimited.Inc()
	}
}
