package httpfilter

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
)

// BenchmarkFinish writes one typical decision line per op, through slog
// (Config.DecisionLog) and through decisionlog's encoder (Config.Decisions),
// both into a decisionlog.Writer over io.Discard as `abox http serve` does.
func BenchmarkFinish(b *testing.B) {
	rec := &record{start: time.Now(), kind: "http", client: "10.0.0.2:41234", method: "GET", host: "example.org", port: 80,
		path: "/index.html", status: 200, verdict: allowlist.Allow, reason: "allowlisted", rule: "example.org", up: 0, down: 5120}
	for _, mode := range []string{"slog", "decisionlog"} {
		b.Run(mode, func(b *testing.B) {
			w := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{io.Discard}})
			defer w.Close()
			p := &Proxy{dlog: slog.New(slog.NewJSONHandler(w, nil))}
			if mode == "decisionlog" {
				p.lines = w
			}
			p.stats.blocked = map[string]uint64{}
			b.ReportAllocs()
			for b.Loop() {
				p.finish(rec)
			}
		})
	}
}
