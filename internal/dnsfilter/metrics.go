package dnsfilter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/abox-dev/abox/internal/metrics"
)

// dnsMetrics are the DNS filter's Prometheus metrics (docs/metrics.md). Each
// is counted in observe, called once per decision where its line is
// written, so a scrape and the decision log count the same queries.
type dnsMetrics struct {
	queries     *metrics.Decisions
	cacheHits   prometheus.Counter
	rateLimited prometheus.Counter
	upstream    prometheus.Histogram
}

// newDNSMetrics registers the DNS filter's metrics in r; nil for none.
func newDNSMetrics(r *metrics.Registry) *dnsMetrics {
	if r == nil {
		return nil
	}
	return &dnsMetrics{
		queries: r.Decisions(metrics.LayerDNS, "abox_dns_queries_total",
			"DNS queries decided, by verdict and reason code.").For(),
		cacheHits: r.Counter(metrics.LayerDNS, "abox_dns_cache_hits_total",
			"Allowed DNS queries answered from the cache."),
		rateLimited: r.Counter(metrics.LayerDNS, "abox_dns_rate_limited_total",
			"DNS queries refused because their client exceeded its query rate."),
		upstream: r.Histogram(metrics.LayerDNS, "abox_dns_upstream_seconds",
			"Time the upstream resolvers took to answer an allowed query that missed the cache.", metrics.LatencyBuckets),
	}
}

// observe counts d, whether or not its line is written (a refusal past the
// client's flood budget is folded into an aggregate line but counted here).
func (m *dnsMetrics) observe(d *decision) {
	if m == nil {
		return
	}
	m.queries.Inc(string(d.verdict), d.reason)
	switch {
	case d.reason == ReasonRateLimited:
		m.rateLimited.Inc()
	case d.cached:
		m.cacheHits.Inc()
	}
	if d.rtt > 0 {
		m.upstream.Observe(d.rtt.Seconds())
	}
}
