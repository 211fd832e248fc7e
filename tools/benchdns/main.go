// Command benchdns measures the DNS filter against a bare miekg/dns server
// on loopback, in the same run: queries per second and p50/p99 latency for
// blocked names and for cached allowed names, with N concurrent clients.
//
//	go run ./tools/benchdns -clients 16 -duration 3s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "benchdns: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	clients  int
	duration time.Duration
	warmup   time.Duration
	logMode  string
	rounds   int
}

func run() error {
	var o options
	flag.IntVar(&o.clients, "clients", 16, "concurrent clients, each with its own UDP socket, one query in flight")
	flag.DurationVar(&o.duration, "duration", 3*time.Second, "measuring time per scenario and server")
	flag.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured time before each measurement")
	flag.StringVar(&o.logMode, "log", "file", "decision log of the filter: file (a JSON line per query to a temp file and the ring, as `abox dns serve --log-file`), ring, or none")
	flag.IntVar(&o.rounds, "rounds", 6, "alternating rounds per scenario")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to FILE")
	flag.Parse()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.clients < 1 || o.duration <= 0 || o.rounds < 1 {
		return errors.New("-clients and -duration must be positive")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	tmp, err := os.MkdirTemp("", "benchdns")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	up := fakedns.New().Add("example.com. 300 IN A 93.184.215.14")
	if err := up.Start("127.0.0.1:0"); err != nil {
		return err
	}
	defer up.Close()

	filterAddr, err := startFilter(ctx, o, tmp, up.Addr)
	if err != nil {
		return err
	}
	refAddr, err := startReference()
	if err != nil {
		return err
	}

	type row struct {
		scenario string
		filter   result
		ref      result
		ratio    float64
	}
	var rows []row
	scenarios := []struct {
		name  string
		names []string
	}{
		{"blocked", blockedNames(1000)},
		{"cached allowed", []string{"example.com"}},
	}
	for _, sc := range scenarios {
		for _, addr := range []string{filterAddr, refAddr} {
			if _, err := load(addr, sc.names, o.clients, o.warmup); err != nil {
				return fmt.Errorf("%s warmup: %w", sc.name, err)
			}
		}
		// Alternate the two servers in short rounds so that noise from the
		// rest of the machine hits both alike; report medians.
		var fs, rs []result
		var ratios []float64
		for i := range o.rounds {
			pair := [2]string{filterAddr, refAddr}
			if i%2 == 1 {
				pair = [2]string{refAddr, filterAddr}
			}
			var got [2]result
			for j, addr := range pair {
				res, err := load(addr, sc.names, o.clients, o.duration/time.Duration(o.rounds))
				if err != nil {
					return fmt.Errorf("%s: %w", sc.name, err)
				}
				got[j] = res
			}
			if i%2 == 1 {
				got[0], got[1] = got[1], got[0]
			}
			fs, rs = append(fs, got[0]), append(rs, got[1])
			ratios = append(ratios, got[0].qps/got[1].qps)
		}
		rows = append(rows, row{sc.name, median(fs), median(rs), medianF(ratios)})
	}
	fmt.Printf("benchdns: %d clients, %s per server and scenario in %d alternating rounds (medians), filter log=%s,\nrate limit off (all clients share 127.0.0.1), GOMAXPROCS=%d, load generator in the same process\n\n",
		o.clients, o.duration, o.rounds, o.logMode, runtime.GOMAXPROCS(0))
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tserver\tqueries/s\tp50\tp99\terrors\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%d\t\n", r.scenario, "filter", r.filter.qps, r.filter.p50.Round(time.Microsecond), r.filter.p99.Round(time.Microsecond), r.filter.errors)
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%s\t%s\t%d\t\n", r.scenario, "reference", r.ref.qps, r.ref.p50.Round(time.Microsecond), r.ref.p99.Round(time.Microsecond), r.ref.errors)
	}
	tw.Flush()
	fmt.Println()
	for _, r := range rows {
		verdict := "ok, goal >= 0.80"
		if r.ratio < 0.8 {
			verdict = "BELOW goal 0.80"
		}
		fmt.Printf("%-15s filter/reference throughput %.2f (%s); latency p50 %.2fx, p99 %.2fx\n", r.scenario,
			r.ratio, verdict, float64(r.filter.p50)/float64(r.ref.p50), float64(r.filter.p99)/float64(r.ref.p99))
	}
	return nil
}

func blockedNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("host%d.blocked.test", i)
	}
	return out
}

// startFilter runs the real filter: policy engine on a file allowlist,
// upstream client, decision log as configured.
func startFilter(ctx context.Context, o options, dir, upAddr string) (string, error) {
	allow := filepath.Join(dir, "allowlist.txt")
	if err := os.WriteFile(allow, []byte("example.com\n*.example.com\n"), 0o644); err != nil {
		return "", err
	}
	var sinks []io.Writer
	ring := logring.New(2000)
	switch o.logMode {
	case "file":
		f, err := os.Create(filepath.Join(dir, "dns.log"))
		if err != nil {
			return "", err
		}
		sinks = []io.Writer{f, ring}
	case "ring":
		sinks = []io.Writer{ring}
	case "none":
	default:
		return "", fmt.Errorf("-log %q: want file, ring or none", o.logMode)
	}
	var dlog *decisionlog.Writer
	log := slog.New(slog.DiscardHandler)
	if sinks != nil {
		dlog = decisionlog.New(decisionlog.Config{Sinks: sinks})
		go func() { <-ctx.Done(); dlog.Close() }()
		log = slog.New(slog.NewJSONHandler(dlog, nil))
	}
	pol, err := policy.New(policy.Config{AllowlistPath: allow, Logger: log})
	if err != nil {
		return "", err
	}
	uc, err := upstream.New(upstream.Config{Servers: []string{upAddr}})
	if err != nil {
		return "", err
	}
	pc, ln, err := dnsfilter.Listen("127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv, err := dnsfilter.New(dnsfilter.Config{
		PacketConn: pc, Listener: ln, Policy: pol, Upstream: uc,
		Addrs: netclass.NewPolicy(nil, nil), Logger: log, DecisionLog: dlog, RateLimit: -1,
	})
	if err != nil {
		return "", err
	}
	go srv.Serve(ctx)
	return pc.LocalAddr().String(), nil
}

// startReference runs a bare miekg/dns server giving the same answers with
// no filtering: NXDOMAIN for the blocked names, the A record for example.com.
func startReference() (string, error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	a := &dns.A{Hdr: dns.RR_Header{Name: "example.com.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.IPv4(93, 184, 215, 14).To4()}
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 && r.Question[0].Name == "example.com." {
			m.Answer = []dns.RR{a}
		} else {
			m.Rcode = dns.RcodeNameError
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(1232, false)
		}
		w.WriteMsg(m)
	})
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: h, NotifyStartedFunc: func() { close(started) }}
	go srv.ActivateAndServe()
	<-started
	return pc.LocalAddr().String(), nil
}

func median(rs []result) result {
	var out result
	pick := func(get func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = get(r)
		}
		return medianF(v)
	}
	out.qps = pick(func(r result) float64 { return r.qps })
	out.p50 = time.Duration(pick(func(r result) float64 { return float64(r.p50) }))
	out.p99 = time.Duration(pick(func(r result) float64 { return float64(r.p99) }))
	for _, r := range rs {
		out.errors += r.errors
	}
	return out
}

func medianF(v []float64) float64 {
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

type result struct {
	qps      float64
	p50, p99 time.Duration
	errors   int
}

// load runs clients closed-loop against addr for d, cycling through names.
func load(addr string, names []string, clients int, d time.Duration) (result, error) {
	queries := make([][]byte, len(names))
	for i, n := range names {
		m := new(dns.Msg)
		m.SetQuestion(n+".", dns.TypeA)
		m.SetEdns0(1232, false)
		b, err := m.Pack()
		if err != nil {
			return result{}, err
		}
		queries[i] = b
	}
	var wg sync.WaitGroup
	lats := make([][]time.Duration, clients)
	errs := make([]int, clients)
	deadline := time.Now().Add(d)
	for c := range clients {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			return result{}, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			buf := make([]byte, 2048)
			q := make([]byte, 0, 512)
			id := uint16(c << 8)
			for i := c; time.Now().Before(deadline); i++ {
				q = append(q[:0], queries[i%len(queries)]...)
				id++
				q[0], q[1] = byte(id>>8), byte(id)
				start := time.Now()
				conn.SetReadDeadline(start.Add(2 * time.Second))
				if _, err := conn.Write(q); err != nil {
					errs[c]++
					continue
				}
				n, err := conn.Read(buf)
				if err != nil || n < 12 || buf[0] != q[0] || buf[1] != q[1] {
					errs[c]++
					continue
				}
				lats[c] = append(lats[c], time.Since(start))
			}
		}()
	}
	wg.Wait()
	var all []time.Duration
	total := 0
	for c := range clients {
		all = append(all, lats[c]...)
		total += errs[c]
	}
	if len(all) == 0 {
		return result{}, errors.New("no query answered")
	}
	slices.Sort(all)
	return result{
		qps:    float64(len(all)) / d.Seconds(),
		p50:    all[len(all)/2],
		p99:    all[len(all)*99/100],
		errors: total,
	}, nil
}
