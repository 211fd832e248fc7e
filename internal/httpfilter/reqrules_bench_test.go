package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/policy"
)

// benchRules is a rule set of 100 rules on one host, the request's rule
// last: each request is tried against all of them.
func benchRules(host string) []string {
	out := make([]string, 0, 100)
	for i := range 99 {
		out = append(out, fmt.Sprintf("%s GET /bench/v%d/*/**", host, i))
	}
	return append(out, host+" GET,HEAD /bench")
}

// BenchmarkRequestRules: the cost of request rules on a keep-alive
// connection through the proxy (plain HTTP, and inside an intercepted
// tunnel): one connection sends the same GET, in blocks of 2048 requests
// (long enough that the CPU clock, which moves on scheduler ticks, splits
// them fairly), while the allowlist in force switches between blocks from
// the host without rules ("none") to the host with 100 ("rules100"), so
// both are measured on the same connection and machine in one run. The
// client and the raw origin do almost nothing, so the process CPU per
// request (getrusage) is mostly the proxy's; rules/none is the ratio
// (goal: at most 1.05). The "same" runs switch between two lists without
// rules: their ratio, which should be 1, shows how much the machine moves
// the figure.
func BenchmarkRequestRules(b *testing.B) {
	for _, tc := range []struct {
		name     string
		inTunnel bool
		rules    bool
	}{{"plain/rules100", false, true}, {"plain/same", false, false}, {"intercepted/rules100", true, true}, {"intercepted/same", true, false}} {
		b.Run(tc.name, func(b *testing.B) {
			lists := [2][]byte{[]byte("rules.test\n"), []byte("rules.test\n")}
			if tc.rules {
				lists[1] = []byte(strings.Join(benchRules("rules.test"), "\n") + "\n")
			}
			h := newHarness(b, hopts{allow: []string{"rules.test"}, decisions: true, sink: io.Discard, rate: -1})
			use := func(k int) {
				if err := os.WriteFile(h.engine.Path(), lists[k], 0o644); err != nil {
					b.Fatal(err)
				}
				if err := h.engine.Reload(); err != nil {
					b.Fatal(err)
				}
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if tc.inTunnel {
				leaf, err := testOriginCA(b).Leaf("rules.test")
				if err != nil {
					b.Fatal(err)
				}
				ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
			}
			serveRaw(b, ln, rawOrigin)
			_, pt, _ := net.SplitHostPort(ln.Addr().String())
			h.allowOrigin("rules.test", nil, pt)
			host := "rules.test:" + pt
			var c net.Conn
			req := "GET http://" + host + "/bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
			if tc.inTunnel {
				tc := tls.Client(h.connect(b, host), &tls.Config{RootCAs: h.proxyCA, ServerName: "rules.test", NextProtos: []string{"http/1.1"}})
				if err := tc.Handshake(); err != nil {
					b.Fatal(err)
				}
				c = tc
				req = "GET /bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
			} else if c, err = net.Dial("tcp", h.addr); err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			br := bufio.NewReader(c)
			body := make([]byte, 64)
			var cpu [2]time.Duration
			var n [2]int
			const block = 2048
			send := func() {
				if _, err := io.WriteString(c, req); err != nil {
					b.Fatal(err)
				}
				m, err := readRawResponse(br)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(br, body[:m]); err != nil || m != 2 {
					b.Fatalf("answer %q %v, want the origin's", body[:m], err)
				}
			}
			// Warm up both lists (the upstream connection, the caches)
			// before anything is measured.
			for k := range 2 {
				use(k)
				for range block {
					send()
				}
			}
			i, k := 0, 0
			use(0)
			runtime.GC()
			mark := processCPU()
			b.ReportAllocs()
			for b.Loop() {
				if i%block == 0 && i > 0 {
					cpu[k] += processCPU() - mark
					k = (i / block) % 2
					b.StopTimer()
					use(k)
					b.StartTimer()
					mark = processCPU()
				}
				i++
				n[k]++
				send()
			}
			cpu[k] += processCPU() - mark
			if n[0] == 0 || n[1] == 0 {
				return // too few iterations to compare
			}
			none := float64(cpu[0].Microseconds()) / float64(n[0])
			rules := float64(cpu[1].Microseconds()) / float64(n[1])
			b.ReportMetric(none, "none-cpu-µs/req")
			b.ReportMetric(rules, "rules100-cpu-µs/req")
			if none > 0 {
				b.ReportMetric(rules/none, "rules/none")
			}
		})
	}
}

// processCPU is the user and system CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCheckRequest is the decision alone: 100 rules, the match last.
func BenchmarkCheckRequest(b *testing.B) {
	h := newHarness(b, hopts{allow: benchRules("rules.test")})
	_, set, _, _ := h.p.decideName("rules.test")
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := CheckRequest(set, policy.Active, "GET", "/bench"); !d.Allowed {
			b.Fatal(d.Reason)
		}
	}
}
