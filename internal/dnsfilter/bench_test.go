package dnsfilter_test

import (
	"context"
	"io"
	"net/netip"
	"runtime"
	"testing"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/metrics"
)

// BenchmarkHandle measures the decision path without sockets: a blocked
// name, a cached allowed name, and the healthcheck, with the decision log
// off and on (to io.Discard through the asynchronous writer, as in production).
// With metrics=on the filter also counts into a registry (docs/metrics.md):
// compare it with metrics=off in the same run.
func BenchmarkHandle(b *testing.B) {
	for _, mode := range []struct {
		name    string
		w       io.Writer
		metrics bool
	}{{"log=off", nil, false}, {"log=on", io.Discard, false}, {"log=on/metrics=on", io.Discard, true}} {
		srv, _, _, _ := newFuzzServerWith(b, mode.w, nil, withMetrics(mode.metrics))
		client := netip.MustParseAddr("192.0.2.10")
		ctx := context.Background()
		for _, bc := range []struct {
			name string
			q    *dns.Msg
		}{
			{"blocked", query("other.org", dns.TypeA, 1232)},
			{"cached", query("www.example.com", dns.TypeA, 1232)},
			{"healthcheck", query("healthcheck.abox.local", dns.TypeA, 1232)},
		} {
			benchLoop(b, bc.name+"/"+mode.name, func() bool { return srv.Handle(ctx, client, "udp", bc.q) != nil })
		}
	}
}

// benchLoop runs answer, which reports whether an answer came, as the
// sub-benchmark name, after one unmeasured call that warms the cache.
func benchLoop(b *testing.B, name string, answer func() bool) {
	answer()
	b.Run(name, func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !answer() {
				b.Fatal("no answer")
			}
		}
	})
}

// BenchmarkDatagram measures the batched UDP path from datagram in to
// datagram out, without the system calls: a blocked name, a cached
// allowed name (answered packed), with and without EDNS, decision log on.
func BenchmarkDatagram(b *testing.B) {
	for _, m := range []bool{false, true} {
		benchDatagram(b, m)
	}
}

func benchDatagram(b *testing.B, metricsOn bool) {
	srv, _, _, _ := newFuzzServerWith(b, io.Discard, nil, withMetrics(metricsOn))
	suffix := "/metrics=off"
	if metricsOn {
		suffix = "/metrics=on"
	}
	client := netip.MustParseAddr("192.0.2.10")
	ctx := context.Background()
	for _, bc := range []struct {
		name string
		q    *dns.Msg
	}{
		{"blocked", query("other.org", dns.TypeA, 0)},
		{"blocked-edns", query("other.org", dns.TypeA, 1232)},
		{"cached", query("www.example.com", dns.TypeA, 0)},
		{"cached-edns", query("www.example.com", dns.TypeA, 1232)},
	} {
		wire, err := bc.q.Pack()
		if err != nil {
			b.Fatal(err)
		}
		dst := make([]byte, 0, dnsfilter.MaxUDPSize)
		benchLoop(b, bc.name+suffix, func() bool { return srv.AnswerDatagram(ctx, wire, client, dst) != nil })
	}
}

// withMetrics measures the server into a registry of its own when on.
func withMetrics(on bool) func(*dnsfilter.Config) {
	if !on {
		return nil
	}
	return func(c *dnsfilter.Config) { c.Metrics = metrics.New("bench") }
}

// BenchmarkMetricsCost measures what the metrics add to the batched UDP
// path of a cached and a blocked query, in CPU time: a server without
// metrics and one with them answer in alternating blocks of 100
// datagrams on one locked thread, timed by that thread's CPU clock, so
// that the other processes of a shared machine neither add to one side
// nor to the other. It reports each one's CPU ns per query and the
// difference in percent.
func BenchmarkMetricsCost(b *testing.B) {
	for _, name := range []string{"cached", "blocked"} {
		b.Run(name, func(b *testing.B) {
			q := query("www.example.com", dns.TypeA, 0)
			if name == "blocked" {
				q = query("other.org", dns.TypeA, 0)
			}
			wire, err := q.Pack()
			if err != nil {
				b.Fatal(err)
			}
			client := netip.MustParseAddr("192.0.2.10")
			ctx := context.Background()
			var srv [2]*dnsfilter.Server
			for i := range srv {
				srv[i], _, _, _ = newFuzzServerWith(b, io.Discard, nil, withMetrics(i == 1))
			}
			dst := make([]byte, 0, dnsfilter.MaxUDPSize)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var spent [2]int64
			const block = 100
			n := 0
			for b.Loop() {
				for i := range srv {
					start := threadCPU(b)
					for range block {
						if srv[i].AnswerDatagram(ctx, wire, client, dst) == nil {
							b.Fatal("no answer")
						}
					}
					spent[i] += threadCPU(b) - start
				}
				n += block
			}
			off, on := float64(spent[0])/float64(n), float64(spent[1])/float64(n)
			b.ReportMetric(off, "cpu-ns/query-off")
			b.ReportMetric(on, "cpu-ns/query-on")
			b.ReportMetric((on-off)/off*100, "%more")
		})
	}
}

// threadCPU is the CPU time of the calling thread in ns.
func threadCPU(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
}
