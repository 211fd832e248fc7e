// Command benchhttp measures the HTTP filter against direct connections to
// the same loopback origins, in the same run: requests per second and
// p50/p99 latency for plain HTTP, CONNECT tunnels and intercepted HTTPS (a
// new connection per request, and keep-alive), MB/s of one large body, and
// the proxy's memory per 1,000 open tunnels.
//
//	go run ./tools/benchhttp -clients 8 -duration 1s -rounds 3
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "benchhttp: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	clients  int
	duration time.Duration
	bigSize  int64
	tunnels  int
	logMode  string
	only     string
	match    string
	rounds   int
}

// loopback resolves every name to 127.0.0.1, as a DNS upstream would.
type loopback struct{}

func (loopback) LookupNetIP(context.Context, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

type env struct {
	o          options
	dir        string
	httpOrigin *httptest.Server
	tlsOrigin  *httptest.Server
	proxyURL   *url.URL
	proxyRoots *x509.CertPool
	origRoots  *x509.CertPool
	proxy      *httpfilter.Proxy
	closers    []func() error
}

func run() error {
	var o options
	flag.IntVar(&o.clients, "clients", 8, "concurrent clients, one request in flight each")
	flag.DurationVar(&o.duration, "duration", time.Second, "measuring time per scenario, path and round")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds alternating direct and proxied runs; the table shows each path's median")
	flag.Int64Var(&o.bigSize, "big", 512<<20, "bytes of the large-body transfer")
	flag.IntVar(&o.tunnels, "tunnels", 1000, "open tunnels for the memory figure")
	flag.StringVar(&o.logMode, "log", "line", "decision log of the proxy: line (a JSON line per request to a temp file through decisionlog's encoder, as abox http serve and the instance daemon write it), file (the same lines through log/slog) or none")
	flag.StringVar(&o.only, "only", "", "run only this part: rps, mbps or memory")
	flag.StringVar(&o.match, "match", "", "run only the rps rows whose scenario and conn contain this (\"plain HTTP keep-alive\"), e.g. to profile one")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to FILE")
	memprofile := flag.String("memprofile", "", "write an allocation profile at the end to FILE")
	flag.Parse()
	if *memprofile != "" {
		runtime.MemProfileRate = 4096
		defer func() {
			if f, err := os.Create(*memprofile); err == nil {
				pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
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
	dir, err := os.MkdirTemp("", "benchhttp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	e := &env{o: o, dir: dir}
	stop, err := e.start()
	if err != nil {
		return err
	}
	defer stop()

	tlsPort := portOf(e.tlsOrigin.URL)
	if o.only == "" || o.only == "rps" {
		e.rps(tlsPort)
	}
	if o.only == "" || o.only == "mbps" {
		e.mbps(tlsPort)
	}
	if o.only != "" && o.only != "memory" {
		return nil
	}
	direct, proxied, err := e.tunnelMemory(tlsPort)
	if err != nil {
		return err
	}
	fmt.Printf("memory for %d open TLS connections (heap+stacks, client and origin included): direct %.1f MiB, through tunnels %.1f MiB\n",
		o.tunnels, mib(direct), mib(proxied))
	fmt.Printf("proxy memory per 1,000 open tunnels: %.1f MiB\n", mib(proxied-direct)*1000/float64(o.tunnels))
	return nil
}

func (e *env) rps(tlsPort string) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "scenario\tconn\tdirect req/s\tproxy req/s\tratio\tdirect p50\tdirect p99\tproxy p50\tproxy p99\tproxy CPU/req\tgoal\t\n")
	httpURL := "http://plain.bench:" + portOf(e.httpOrigin.URL) + "/"
	for _, keep := range []bool{true, false} {
		conn := "keep-alive"
		if !keep {
			conn = "new"
		}
		want := func(name string) bool { return strings.Contains(name+" "+conn, e.o.match) }
		if want("plain HTTP") {
			d, p := e.alternate(func() result { return e.measure(e.client(keep, false, nil), httpURL) },
				func() result { return e.measure(e.client(keep, true, nil), httpURL) })
			row(tw, "plain HTTP", conn, d, p, 0.5)
		}
		if want("CONNECT tunnel") {
			d, p := e.alternate(func() result { return e.measure(e.client(keep, false, e.origRoots), "https://mitm.bench:"+tlsPort+"/") },
				func() result {
					return e.measure(e.client(keep, true, e.origRoots), "https://tunnel.bench:"+tlsPort+"/")
				})
			row(tw, "CONNECT tunnel", conn, d, p, 0)
		}
		if want("intercepted HTTPS") {
			d, p := e.alternate(func() result { return e.measure(e.client(keep, false, e.origRoots), "https://mitm.bench:"+tlsPort+"/") },
				func() result { return e.measure(e.client(keep, true, e.proxyRoots), "https://mitm.bench:"+tlsPort+"/") })
			row(tw, "intercepted HTTPS", conn, d, p, 0)
		}
	}
	tw.Flush()
	fmt.Println()
}

// alternate runs direct and proxied measurements in turns, so that a busy
// neighbour on the machine hits both alike, and returns each one's median.
// The order flips every round (direct first, then proxied first, ...) so
// neither path always runs second, after the other's warm-up; and the heap
// is collected before each run, so no run pays for the garbage of the one
// before it (client, origins and proxy share one process).
func (e *env) alternate(direct, proxied func() result) (result, result) {
	var ds, ps []result
	for i := 0; i < e.o.rounds; i++ {
		runtime.GC()
		if i%2 == 0 {
			ds = append(ds, direct())
			runtime.GC()
			ps = append(ps, proxied())
		} else {
			ps = append(ps, proxied())
			runtime.GC()
			ds = append(ds, direct())
		}
	}
	return median(ds), median(ps)
}

// median returns the run with the median rate, with the median CPU cost of
// all runs (the two medians need not come from the same run).
func median(rs []result) result {
	cpus := make([]float64, len(rs))
	for i, r := range rs {
		cpus[i] = r.cpu
	}
	slices.Sort(cpus)
	slices.SortFunc(rs, func(a, b result) int {
		switch {
		case a.rps < b.rps:
			return -1
		case a.rps > b.rps:
			return 1
		}
		return 0
	})
	m := rs[len(rs)/2]
	m.cpu = cpus[len(cpus)/2]
	return m
}

func (e *env) mbps(tlsPort string) {
	o := e.o
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "large body (%d MiB)\tdirect MB/s\tproxy MB/s\tratio\tproxy CPU ms/GB\tgoal\t\n", o.bigSize>>20)
	big := "/big?n=" + strconv.FormatInt(o.bigSize, 10)
	plain := "http://plain.bench:" + portOf(e.httpOrigin.URL) + big
	tput := func(keep, via bool, roots *x509.CertPool, u string) func() result {
		return func() result { return e.throughput(e.client(keep, via, roots), u) }
	}
	d, p := e.alternate(tput(true, false, nil, plain), tput(true, true, nil, plain))
	fmt.Fprintf(tw, "plain HTTP\t%.0f\t%.0f\t%.2f\t%.0f\t\t\n", d.rps, p.rps, p.rps/d.rps, (p.cpu-d.cpu)*1e6)
	d, p = e.alternate(tput(true, false, e.origRoots, "https://mitm.bench:"+tlsPort+big), tput(true, true, e.origRoots, "https://tunnel.bench:"+tlsPort+big))
	fmt.Fprintf(tw, "CONNECT tunnel\t%.0f\t%.0f\t%.2f\t%.0f\t%s\t\n", d.rps, p.rps, p.rps/d.rps, (p.cpu-d.cpu)*1e6, goal(p.rps/d.rps, 0.9))
	d, p = e.alternate(tput(true, false, e.origRoots, "https://mitm.bench:"+tlsPort+big), tput(true, true, e.proxyRoots, "https://mitm.bench:"+tlsPort+big))
	fmt.Fprintf(tw, "intercepted HTTPS\t%.0f\t%.0f\t%.2f\t%.0f\t%s\t\n", d.rps, p.rps, p.rps/d.rps, (p.cpu-d.cpu)*1e6, goal(p.rps/d.rps, 0.5))
	tw.Flush()
	fmt.Println()
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

func goal(r, want float64) string {
	if want == 0 {
		return ""
	}
	if r >= want {
		return fmt.Sprintf(">=%.1f ok", want)
	}
	return fmt.Sprintf(">=%.1f MISSED", want)
}

func row(tw io.Writer, name, conn string, d, p result, want float64) {
	fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.2f\t%v\t%v\t%v\t%v\t%.1fµs\t%s\t\n", name, conn, d.rps, p.rps, p.rps/d.rps,
		d.p50.Round(time.Microsecond), d.p99.Round(time.Microsecond), p.p50.Round(time.Microsecond), p.p99.Round(time.Microsecond),
		(p.cpu-d.cpu)*1e6, goal(p.rps/d.rps, want))
}

func portOf(u string) string {
	pu, _ := url.Parse(u)
	return pu.Port()
}

func (e *env) start() (func(), error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello, bench\n") })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.Copy(w, &zeros{n})
	})
	origCA, err := ca.New(ca.Config{Dir: filepath.Join(e.dir, "origin-ca"), Name: "bench origins"})
	if err != nil {
		return nil, err
	}
	oc, err := origCA.Certificate()
	if err != nil {
		return nil, err
	}
	e.origRoots = x509.NewCertPool()
	e.origRoots.AddCert(oc)
	e.httpOrigin = httptest.NewServer(mux)
	e.tlsOrigin = httptest.NewUnstartedServer(mux)
	e.tlsOrigin.TLS = &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return origCA.Leaf(h.ServerName) }}
	e.tlsOrigin.StartTLS()

	al := filepath.Join(e.dir, "allow.txt")
	os.WriteFile(al, []byte("mitm.bench\ntunnel.bench\nplain.bench\n"), 0o644)
	pol, err := policy.New(policy.Config{AllowlistPath: al})
	if err != nil {
		return nil, err
	}
	proxyCA, err := ca.New(ca.Config{Dir: filepath.Join(e.dir, "ca")})
	if err != nil {
		return nil, err
	}
	pem, err := proxyCA.CertPEM()
	if err != nil {
		return nil, err
	}
	e.proxyRoots = x509.NewCertPool()
	e.proxyRoots.AppendCertsFromPEM(pem)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(e.dir, "decisions.log"))
	if err != nil {
		return nil, err
	}
	var dlog *slog.Logger
	var lines *decisionlog.Writer
	switch e.o.logMode {
	case "file", "line":
		// As `abox http serve --log-file`: batched to the file.
		dw := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{logf}})
		e.closers = append(e.closers, dw.Close)
		dlog = slog.New(slog.NewJSONHandler(dw, nil))
		if e.o.logMode == "line" {
			lines = dw
		}
	case "none":
	default:
		return nil, fmt.Errorf("-log %q: want file, line or none", e.o.logMode)
	}
	hp, _ := strconv.Atoi(portOf(e.httpOrigin.URL))
	tp, _ := strconv.Atoi(portOf(e.tlsOrigin.URL))
	e.proxy, err = httpfilter.New(httpfilter.Config{
		Listener:       ln,
		Policy:         pol,
		Resolver:       loopback{},
		Addresses:      netclass.New(netclass.Options{PermitHost: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}),
		Ports:          []uint16{uint16(hp), uint16(tp)},
		CA:             proxyCA,
		MITMExceptions: []string{"tunnel.bench"},
		UpstreamRoots:  e.origRoots,
		DecisionLog:    dlog,
		Decisions:      lines,
		MaxConns:       4 * e.o.tunnels,
		// One load generator is one client: the per-guest request rate
		// limit would measure itself, not the proxy.
		RequestRate: -1,
	})
	if err != nil {
		return nil, err
	}
	e.proxyURL = &url.URL{Scheme: "http", Host: ln.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.proxy.Serve(ctx) }()
	return func() {
		cancel()
		<-done
		e.httpOrigin.Close()
		e.tlsOrigin.Close()
		for _, c := range e.closers {
			c()
		}
		logf.Close()
	}, nil
}

// client builds a transport; roots nil means plain HTTP. Direct clients dial
// 127.0.0.1 whatever the name, as the proxy does after its lookup.
func (e *env) client(keepAlive, viaProxy bool, roots *x509.CertPool) *http.Client {
	tr := &http.Transport{
		DisableKeepAlives:   !keepAlive,
		MaxIdleConnsPerHost: e.o.clients,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 on both paths
		TLSClientConfig:     &tls.Config{RootCAs: roots, ClientSessionCache: nil},
	}
	if viaProxy {
		tr.Proxy = http.ProxyURL(e.proxyURL)
	} else {
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(addr)
			return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
		}
	}
	return &http.Client{Transport: tr}
}

type result struct {
	rps      float64
	cpu      float64 // CPU time of the whole process per request (per MB for throughput), seconds
	p50, p99 time.Duration
}

func (e *env) measure(c *http.Client, u string) result {
	defer c.CloseIdleConnections()
	if os.Getenv("BENCH_DEBUG") != "" {
		before := e.proxy.Stats().(httpfilter.Stats).UpstreamDials
		defer func() {
			st := e.proxy.Stats().(httpfilter.Stats)
			fmt.Fprintf(os.Stderr, "%s: upstream dials %d, requests %d\n", u, st.UpstreamDials-before, st.Requests)
		}()
	}
	// Warm up: connections, certificate cache.
	for i := 0; i < 20; i++ {
		get(c, u)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lat   []time.Duration
		count atomic.Int64
	)
	deadline := time.Now().Add(e.o.duration)
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < e.o.clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := get(c, u); err != nil {
					fmt.Fprintf(os.Stderr, "benchhttp: %s: %v\n", u, err)
					return
				}
				mine = append(mine, time.Since(t0))
				count.Add(1)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	el := time.Since(start)
	slices.Sort(lat)
	r := result{rps: float64(count.Load()) / el.Seconds(), cpu: (cpuTime() - cpu0).Seconds() / float64(count.Load())}
	if len(lat) > 0 {
		r.p50 = lat[len(lat)/2]
		r.p99 = lat[len(lat)*99/100]
	}
	return r
}

func get(c *http.Client, u string) error {
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return err
}

func (e *env) throughput(c *http.Client, u string) result {
	defer c.CloseIdleConnections()
	cpu0 := cpuTime()
	start := time.Now()
	resp, err := c.Get(u)
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchhttp: %v\n", err)
		return result{}
	}
	n, _ := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mb := float64(n) / 1e6
	return result{rps: mb / time.Since(start).Seconds(), cpu: (cpuTime() - cpu0).Seconds() / mb}
}

// cpuTime is the CPU time (user and system) the process has used. Client
// and origins do the same work per request on both paths, so the proxied
// run's CPU per request minus the direct run's is what the proxy costs: a
// figure a busy machine disturbs much less than requests/s.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime))
}

// tunnelMemory opens n TLS connections to the origin directly, then n
// through CONNECT tunnels, and reports the in-use memory each added.
func (e *env) tunnelMemory(port string) (direct, proxied uint64, err error) {
	open := func(viaProxy bool) (uint64, error) {
		base := inUse()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := 0; i < e.o.tunnels; i++ {
			var c net.Conn
			var err error
			if viaProxy {
				c, err = connect(e.proxyURL.Host, "tunnel.bench:"+port)
			} else {
				c, err = net.Dial("tcp", "127.0.0.1:"+port)
			}
			if err != nil {
				return 0, err
			}
			tc := tls.Client(c, &tls.Config{RootCAs: e.origRoots, ServerName: "tunnel.bench"})
			if err := tc.Handshake(); err != nil {
				c.Close()
				return 0, err
			}
			conns = append(conns, tc)
		}
		time.Sleep(200 * time.Millisecond)
		return inUse() - min(base, inUse()), nil
	}
	if direct, err = open(false); err != nil {
		return 0, 0, err
	}
	time.Sleep(300 * time.Millisecond)
	if proxied, err = open(true); err != nil {
		return 0, 0, err
	}
	return direct, proxied, nil
}

func inUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

func connect(proxy, authority string) (net.Conn, error) {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	buf := make([]byte, 0, 64)
	one := make([]byte, 1)
	for !endsWith(buf, "\r\n\r\n") {
		if _, err := c.Read(one); err != nil {
			c.Close()
			return nil, err
		}
		buf = append(buf, one[0])
		if len(buf) > 1024 {
			c.Close()
			return nil, errors.New("CONNECT response too long")
		}
	}
	if len(buf) < 12 || string(buf[9:12]) != "200" {
		c.Close()
		return nil, fmt.Errorf("CONNECT %s: %q", authority, buf)
	}
	return c, nil
}

func endsWith(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[len(b)-len(s):]) == s
}
