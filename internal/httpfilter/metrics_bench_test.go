package httpfilter

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/metrics"
)

// BenchmarkFinishMetrics is BenchmarkFinish's decisionlog mode with the
// metrics off and on: finish is the one place the proxy counts, so the
// difference is all metrics add to a request (compare it with
// BenchmarkKeepAlive's time per request, docs/metrics.md).
func BenchmarkFinishMetrics(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "metrics=off", true: "metrics=on"}[on], func(b *testing.B) {
			rec := &record{start: time.Now(), kind: "http", client: "10.0.0.2:41234", method: "GET", host: "example.org", port: 80,
				path: "/index.html", status: 200, verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, rule: "example.org", up: 0, down: 5120}
			w := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{io.Discard}})
			defer w.Close()
			p := &Proxy{dlog: slog.New(slog.NewJSONHandler(w, nil)), lines: w}
			if on {
				p.cfg.Metrics = NewMetrics(metrics.New("bench"))
			}
			p.stats.blocked = map[string]uint64{}
			b.ReportAllocs()
			for b.Loop() {
				p.finish(rec)
			}
		})
	}
}

// BenchmarkObserve is the metrics' part of finish alone.
func BenchmarkObserve(b *testing.B) {
	m := NewMetrics(metrics.New("bench"))
	rec := &record{kind: "inner", verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, up: 120, down: 5120, ruleSet: "example.org"}
	b.ReportAllocs()
	for b.Loop() {
		m.observe(rec)
	}
}
