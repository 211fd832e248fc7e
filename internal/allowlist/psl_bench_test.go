package allowlist

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

var tableCost = sync.OnceValues(func() (time.Duration, uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	suffixesBelow()
	d := time.Since(t0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	return d, after.HeapAlloc - before.HeapAlloc
})

// BenchmarkSuffixTable: a wildcard entry's check once the table of names
// with a public suffix below them exists; build-ms and MB-heap are the
// table's one-time cost (on the first wildcard entry of a process).
func BenchmarkSuffixTable(b *testing.B) {
	d, heap := tableCost()
	for b.Loop() {
		if _, err := ParseEntry("*.mybucket.s3.amazonaws.com"); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(d.Microseconds())/1000, "build-ms")
	b.ReportMetric(float64(heap)/(1<<20), "MB-heap")
	b.ReportMetric(float64(len(suffixesBelow())), "names")
}
