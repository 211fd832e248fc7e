// Command benchproc measures the real abox binary as a process, the way a
// guest uses it: the filter under test runs alone on one CPU, the load
// generator and the fixtures (an origin web server, an authoritative DNS
// server the filters resolve through) on the other; rounds are interleaved
// (every target once per round, started fresh), ratios to the reference are
// taken within a round, and the server's CPU per operation comes from
// /proc. It prints one markdown table of medians. Speed is never asserted.
//
//	go run ./tools/benchproc -abox bin/abox            (make bench)
//	go run ./tools/benchproc -rounds 1 -d 2s -tests http,dns-blocked
package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

type options struct {
	abox                 string
	rounds, workers      int
	dur, warmup          time.Duration
	serverCPU, clientCPU int
	tests                map[string]bool
	dir                  string
}

func main() {
	var o options
	var tests string
	flag.StringVar(&o.abox, "abox", "bin/abox", "the abox binary to measure")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds")
	flag.DurationVar(&o.dur, "d", 3*time.Second, "measured time per test and round")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "unmeasured load before each test")
	flag.IntVar(&o.workers, "c", 32, "concurrent workers (closed loop)")
	flag.IntVar(&o.serverCPU, "server-cpu", 0, "CPU of the target under test")
	flag.IntVar(&o.clientCPU, "client-cpu", 1, "CPU of the load generator and fixtures")
	flag.StringVar(&tests, "tests", "http,connect-ka,dns-blocked,dns-cached", "comma-separated tests")
	flag.Parse()
	o.tests = map[string]bool{}
	for _, t := range strings.Split(tests, ",") {
		o.tests[strings.TrimSpace(t)] = true
	}
	log.SetFlags(0)
	if err := run(o); err != nil {
		log.Fatalf("benchproc: %v", err)
	}
}

// target is one server measured in a section; the first of a section is
// the reference.
type target struct {
	name string
	// start launches it pinned to the server CPU and returns the address
	// clients use ("" = talk to the origin directly) and its process.
	start func() (addr string, p *proc, err error)
}

type result struct {
	test, target string
	round        int
	rate         float64 // operations/s
	cpuPerOp     float64 // server µs per operation
	p50, p99     time.Duration
	errors       int
	// late counts operations whose answer had arrived when the worker
	// came to read it past its deadline: the load generator, not the
	// server, was held up (see errLate).
	late int
}

func run(o options) error {
	abox, err := filepath.Abs(o.abox)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abox); err != nil {
		return fmt.Errorf("abox binary: %w (run make build)", err)
	}
	if o.dir, err = os.MkdirTemp("", "abox-benchproc"); err != nil {
		return err
	}
	defer os.RemoveAll(o.dir)
	// The load generator is pinned like any fixture.
	if err := pin(0, o.clientCPU); err != nil {
		return err
	}
	for _, tool := range []string{"fakedns", "testorigin"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(o.dir, tool), "./tools/"+tool).CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", tool, err, out)
		}
	}
	fx, err := startFixtures(o)
	if err != nil {
		return err
	}
	defer fx.stop()

	httpTargets := []target{
		{name: "direct", start: func() (string, *proc, error) {
			h, hs := freePort(), freePort()
			p, err := o.spawn(o.serverCPU, "", filepath.Join(o.dir, "testorigin"), "-http", h, "-https", hs, "-names", "origin.allowed.test,127.0.0.1")
			if err != nil {
				return "", nil, err
			}
			fx.directHTTP, fx.directHTTPS = h, hs
			return "", p, waitTCP(hs)
		}},
		{name: "abox", start: func() (string, *proc, error) {
			addr := freePort()
			p, err := o.spawn(o.serverCPU, "SSL_CERT_FILE="+fx.originCA, abox, "http", "serve", "--listen", addr,
				"--upstream", fx.dns, "--allowlist", fx.allowlist, "--allow-host", "127.0.0.0/8", "--upstream-ca", fx.originCA,
				"--ca-dir", filepath.Join(o.dir, "ca"), "--ports", fx.ports, "--rate-limit", "0", "--log-file", filepath.Join(o.dir, "http.log"))
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitTCP(addr)
		}},
	}
	dnsTargets := []target{
		{name: "upstream", start: func() (string, *proc, error) {
			addr := freePort()
			p, err := o.spawn(o.serverCPU, "", filepath.Join(o.dir, "fakedns"), "-listen", addr, "-zone", fx.zone)
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitDNS(addr)
		}},
		{name: "abox", start: func() (string, *proc, error) {
			addr := freePort()
			// The zone answers 127.0.0.1: without --allow-host the filter
			// would refuse every allowed name as rebinding.
			p, err := o.spawn(o.serverCPU, "", abox, "dns", "serve", "--listen", addr, "--upstream", fx.dns,
				"--allowlist", fx.allowlist, "--allow-host", "127.0.0.0/8", "--rate-limit", "0", "--log-file", filepath.Join(o.dir, "dns.log"))
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitDNS(addr)
		}},
	}
	if dm, err := exec.LookPath("dnsmasq"); err == nil {
		dnsTargets = append(dnsTargets, target{name: "dnsmasq", start: func() (string, *proc, error) {
			addr := freePort()
			host, port, _ := net.SplitHostPort(addr)
			up := strings.Replace(fx.dns, ":", "#", 1)
			p, err := o.spawn(o.serverCPU, "", dm, "-k", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
				"--listen-address="+host, "--port="+port, "--server="+up, "--address=/blocked.test/", "--cache-size=10000", "--user=root", "--pid-file=")
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitDNS(addr)
		}})
	}

	var results []result
	type section struct {
		targets []target
		tests   []string
	}
	for _, s := range []section{{httpTargets, []string{"http", "connect-ka"}}, {dnsTargets, []string{"dns-blocked", "dns-cached"}}} {
		var tests []string
		for _, t := range s.tests {
			if o.tests[t] {
				tests = append(tests, t)
			}
		}
		if len(tests) == 0 {
			continue
		}
		for r := 1; r <= o.rounds; r++ {
			for _, tg := range s.targets {
				addr, p, err := tg.start()
				if err != nil {
					if p != nil {
						p.stop()
					}
					return fmt.Errorf("starting %s: %w", tg.name, err)
				}
				for _, t := range tests {
					res := o.measure(t, addr, fx, p)
					res.target, res.round = tg.name, r
					log.Printf("round %d %-8s %-12s %9.0f/s  server %6.1f µs/op  p50 %s p99 %s  errors %d  late %d",
						r, tg.name, t, res.rate, res.cpuPerOp, res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond), res.errors, res.late)
					results = append(results, res)
				}
				p.stop()
			}
		}
	}
	printTable(results, o.rounds)
	return nil
}

type fixtures struct {
	dns, allowlist, zone, originCA string
	originHTTP, originHTTPS        string
	directHTTP, directHTTPS        string
	ports                          string
	procs                          []*proc
}

func (f *fixtures) stop() {
	for _, p := range f.procs {
		p.stop()
	}
}

func startFixtures(o options) (*fixtures, error) {
	f := &fixtures{
		allowlist: filepath.Join(o.dir, "allow.txt"), zone: filepath.Join(o.dir, "zone.txt"), originCA: filepath.Join(o.dir, "origin-ca.pem"),
		dns: freePort(), originHTTP: freePort(), originHTTPS: freePort(),
	}
	if err := os.WriteFile(f.allowlist, []byte("*.allowed.test\n"), 0o644); err != nil {
		return nil, err
	}
	var zone strings.Builder
	zone.WriteString("origin.allowed.test. 300 IN A 127.0.0.1\n")
	for i := range 100 {
		fmt.Fprintf(&zone, "a%04d.allowed.test. 300 IN A 127.0.0.1\n", i)
	}
	if err := os.WriteFile(f.zone, []byte(zone.String()), 0o644); err != nil {
		return nil, err
	}
	p, err := o.spawn(o.clientCPU, "", filepath.Join(o.dir, "fakedns"), "-listen", f.dns, "-zone", f.zone)
	if err != nil {
		return nil, err
	}
	f.procs = append(f.procs, p)
	p, err = o.spawn(o.clientCPU, "", filepath.Join(o.dir, "testorigin"), "-http", f.originHTTP, "-https", f.originHTTPS,
		"-names", "origin.allowed.test,127.0.0.1", "-ca-out", f.originCA)
	if err != nil {
		f.stop()
		return nil, err
	}
	f.procs = append(f.procs, p)
	if err := errors.Join(waitDNS(f.dns), waitTCP(f.originHTTPS)); err != nil {
		f.stop()
		return nil, err
	}
	_, hp, _ := net.SplitHostPort(f.originHTTP)
	_, sp, _ := net.SplitHostPort(f.originHTTPS)
	f.ports = hp + "," + sp
	return f, nil
}

// proc is a started process; its CPU time is read from /proc.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (o *options) spawn(cpu int, env, exe string, args ...string) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), "ABOX_HOME="+filepath.Join(o.dir, "home"))
	if env != "" {
		cmd.Env = append(cmd.Env, env)
	}
	cmd.Stderr = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	if err := pin(cmd.Process.Pid, cpu); err != nil {
		cmd.Process.Kill()
		return nil, err
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu returns the process's user+system CPU time, all threads.
func (p *proc) cpu() time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// pin binds pid (0: this process, all threads) to one CPU.
func pin(pid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if pid != 0 {
		return unix.SchedSetaffinity(pid, &set)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, _ := strconv.Atoi(t.Name())
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return err
		}
	}
	return nil
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitTCP(addr string) error {
	for range 200 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}

func waitDNS(addr string) error {
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	for range 100 {
		if _, _, err := c.Exchange(new(dns.Msg).SetQuestion("a0000.allowed.test.", dns.TypeA), addr); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no DNS answers on %s", addr)
}

// measure runs one closed-loop test against a started target: warm-up,
// then o.dur of load, reading the target's CPU before and after.
func (o *options) measure(test, addr string, fx *fixtures, p *proc) result {
	var op func(w int) func() error
	switch test {
	case "http", "connect-ka":
		url := "http://origin.allowed.test:" + port(fx.originHTTP) + "/small"
		if test == "connect-ka" {
			url = "https://origin.allowed.test:" + port(fx.originHTTPS) + "/small"
		}
		if addr == "" { // direct: the reference origin on the server CPU
			url = strings.Replace(strings.Replace(url, port(fx.originHTTP), port(fx.directHTTP), 1), port(fx.originHTTPS), port(fx.directHTTPS), 1)
			url = strings.Replace(url, "origin.allowed.test", "127.0.0.1", 1)
		}
		op = func(int) func() error { return httpWorker(addr, url) }
	case "dns-blocked", "dns-cached":
		op = func(w int) func() error { return dnsWorker(addr, test == "dns-blocked", w) }
	}
	workers := make([]func() error, o.workers)
	for i := range workers {
		workers[i] = op(i)
	}
	var measuring atomic.Bool
	var stopped atomic.Bool
	var mu sync.Mutex
	var lat []time.Duration
	var errs, late atomic.Int64
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			var mine []time.Duration
			for !stopped.Load() {
				t0 := time.Now()
				err := w()
				if measuring.Load() {
					switch {
					case errors.Is(err, errLate):
						late.Add(1)
					case err != nil:
						errs.Add(1)
					default:
						mine = append(mine, time.Since(t0))
					}
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	time.Sleep(o.warmup)
	c0, t0 := p.cpu(), time.Now()
	measuring.Store(true)
	time.Sleep(o.dur)
	measuring.Store(false)
	c1, el := p.cpu(), time.Since(t0)
	stopped.Store(true)
	wg.Wait()
	slices.Sort(lat)
	res := result{test: test, errors: int(errs.Load()), late: int(late.Load())}
	if n := len(lat); n > 0 {
		res.rate = float64(n) / el.Seconds()
		res.cpuPerOp = float64((c1 - c0).Microseconds()) / float64(n)
		res.p50, res.p99 = lat[n/2], lat[n*99/100]
	}
	return res
}

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// httpWorker returns one keep-alive client (one connection, or one CONNECT
// tunnel with one TLS session) issuing GETs.
func httpWorker(proxy, target string) func() error {
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true},
		MaxIdleConnsPerHost: 1, MaxConnsPerHost: 1, DisableCompression: true,
	}
	if proxy != "" {
		u := &url.URL{Scheme: "http", Host: proxy}
		tr.Proxy = http.ProxyURL(u)
	}
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return func() error {
		resp, err := c.Get(target)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
}

// dnsWorker returns one UDP client asking 100 names in turn: blocked
// names (NXDOMAIN from a filter) or allowed ones (cached after warm-up).
func dnsWorker(addr string, blocked bool, w int) func() error {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return func() error { return err }
	}
	var qs [][]byte
	for i := range 100 {
		name := fmt.Sprintf("a%04d.allowed.test.", i)
		if blocked {
			name = fmt.Sprintf("b%04d.blocked.test.", i)
		}
		m := new(dns.Msg).SetQuestion(name, dns.TypeA)
		m.Id = uint16(w<<8 | i)
		b, _ := m.Pack()
		qs = append(qs, b)
	}
	buf := make([]byte, 1500)
	i := 0
	return func() error {
		q := qs[i%len(qs)]
		i++
		// A lost datagram costs a short wait and counts as an error, so
		// one loss does not stall a closed-loop worker for seconds.
		conn.SetDeadline(time.Now().Add(250 * time.Millisecond))
		if _, err := conn.Write(q); err != nil {
			return err
		}
		for {
			n, err := conn.Read(buf)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A stall of this process past the deadline (a busy
				// machine) times out every worker at once even though
				// the answers are queued: one error per worker. Look
				// once more without waiting to tell the two apart.
				conn.SetReadDeadline(time.Now().Add(time.Millisecond))
				for {
					n, err := conn.Read(buf)
					if err != nil {
						return err
					}
					if n >= 12 && buf[0] == q[0] && buf[1] == q[1] {
						if err := checkAnswer(buf[:n], blocked); err != nil {
							return err
						}
						return errLate
					}
				}
			}
			if err != nil {
				return err
			}
			if n >= 12 && buf[0] == q[0] && buf[1] == q[1] {
				return checkAnswer(buf[:n], blocked)
			}
		}
	}
}

// checkAnswer is an error unless the answer is what the test asks for:
// NXDOMAIN for a blocked name, NOERROR with one answer record for an
// allowed one (a filter refusing it, as rebinding say, is not measured).
func checkAnswer(b []byte, blocked bool) error {
	rcode, answers := b[3]&0xF, int(b[6])<<8|int(b[7])
	switch {
	case blocked && rcode != dns.RcodeNameError:
		return fmt.Errorf("blocked name answered with rcode %d", rcode)
	case !blocked && (rcode != dns.RcodeSuccess || answers == 0):
		return fmt.Errorf("allowed name answered with rcode %d and %d records", rcode, answers)
	}
	return nil
}

// errLate marks an answer that arrived in time but was read late because
// the load generator itself was held up; it is not the server's error.
var errLate = errors.New("answer read late: the load generator stalled")

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// printTable prints medians per (test, target); "vs ref" is the median of
// the per-round ratios to the section's first target.
func printTable(rs []result, rounds int) {
	ref := map[string]map[int]float64{} // test → round → reference rate
	refName := map[string]string{}
	for _, r := range rs {
		if _, ok := refName[r.test]; !ok {
			refName[r.test] = r.target
		}
		if r.target == refName[r.test] {
			if ref[r.test] == nil {
				ref[r.test] = map[int]float64{}
			}
			ref[r.test][r.round] = r.rate
		}
	}
	type row struct{ test, target string }
	var order []row
	by := map[row][]result{}
	for _, r := range rs {
		k := row{r.test, r.target}
		if by[k] == nil {
			order = append(order, k)
		}
		by[k] = append(by[k], r)
	}
	fmt.Printf("\n%d rounds; server pinned alone on one CPU, load generator and fixtures on the other\n\n", rounds)
	fmt.Println("| test | target | rate/s | vs ref | server µs/op | p50 | p99 | errors | late |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, k := range order {
		var rate, ratio, cpu, p50, p99 []float64
		errs, late := 0, 0
		for _, r := range by[k] {
			late += r.late
			rate = append(rate, r.rate)
			cpu = append(cpu, r.cpuPerOp)
			p50 = append(p50, float64(r.p50.Microseconds())/1000)
			p99 = append(p99, float64(r.p99.Microseconds())/1000)
			if rr := ref[k.test][r.round]; rr > 0 {
				ratio = append(ratio, r.rate/rr)
			}
			errs += r.errors
		}
		fmt.Printf("| %s | %s | %.0f | %.2f | %.1f | %.2f ms | %.2f ms | %d | %d |\n", k.test, k.target, median(rate), median(ratio), median(cpu), median(p50), median(p99), errs, late)
	}
	fmt.Println("\nerrors: no answer within 250 ms. late: the answer was there but the load generator read it past its deadline.")
	fmt.Println("Either comes in bursts of one per worker (32) when one side is held up for longer than 250 ms on a busy machine.")
}
