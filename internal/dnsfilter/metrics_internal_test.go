package dnsfilter

import (
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/metrics"
)

// BenchmarkObserve is the whole cost metrics add to a decision: a cached
// allowed query's counting.
func BenchmarkObserve(b *testing.B) {
	m := newDNSMetrics(metrics.New("bench"))
	d := decision{verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, cached: true}
	b.ReportAllocs()
	for b.Loop() {
		m.observe(&d)
	}
}
