package httpfilter

import (
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/metrics"
)

// BenchmarkFinishMetrics is BenchmarkFinish's decisionlog mode with the
// metrics off and on: finish is the one place the proxy counts, so the
// difference is all metrics add to a request (compare it with
// BenchmarkKeepAlive's time per request, docs/metrics.md). The two
// proxies finish in alternating blocks of 100 records on one locked
// thread, timed by its CPU clock, so that a shared machine's other work
// falls on neither; it reports CPU ns per record of each and the
// difference in percent.
func BenchmarkFinishMetrics(b *testing.B) {
	rec := &record{start: time.Now(), kind: "http", client: "10.0.0.2:41234", method: "GET", host: "example.org", port: 80,
		path: "/index.html", status: 200, verdict: allowlist.Allow, reason: allowlist.ReasonAllowlisted, rule: "example.org", up: 0, down: 5120}
	var p [2]*Proxy
	for i := range p {
		w := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{io.Discard}})
		defer w.Close()
		p[i] = &Proxy{dlog: slog.New(slog.NewJSONHandler(w, nil)), lines: w}
		if i == 1 {
			p[i].cfg.Metrics = NewMetrics(metrics.New("bench"))
		}
		p[i].stats.blocked = map[string]uint64{}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var spent [2]int64
	const block = 100
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		for i := range p {
			start := threadCPU(b)
			for range block {
				p[i].finish(rec)
			}
			spent[i] += threadCPU(b) - start
		}
		n += block
	}
	off, on := float64(spent[0])/float64(n), float64(spent[1])/float64(n)
	b.ReportMetric(off, "cpu-ns/finish-off")
	b.ReportMetric(on, "cpu-ns/finish-on")
	b.ReportMetric(on-off, "cpu-ns-more")
}

// threadCPU is the CPU time of the calling thread in ns.
func threadCPU(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
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
