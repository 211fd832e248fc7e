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
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The tests, as in the shared kit (../shared/bench): keep-alive GETs of a
// 128-byte body over 32 connections and over one, through CONNECT tunnels
// (intercepted), and one stream of 256 MiB plain and intercepted.
var (
	httpTests = []string{"http", "http-c1", "connect-ka", "tput-http", "tput-tls"}
	dnsTests  = []string{"dns-blocked", "dns-cached"}
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
	flag.StringVar(&tests, "tests", strings.Join(append(append([]string{}, httpTests...), dnsTests...), ","), "comma-separated tests")
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
	// byIP addresses the origin as 127.0.0.1 through this target (a
	// proxy that does not resolve names through the fixture's DNS).
	byIP bool
	// only limits the target to these tests (nil: all of its section).
	only []string
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
	// clientCores is the CPU of the client side (load generator and
	// fixtures, one core) over the window.
	clientCores float64
	otherCores  float64 // the rest of the machine's busy time
	perMB       bool    // rate is MB/s and cpuPerOp µs per MB
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
	for _, tool := range []string{"fakedns", "testorigin", "tcprelay"} {
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
			p, err := o.spawn(o.serverCPU, "", filepath.Join(o.dir, "testorigin"), "-http1", "-http", h, "-https", hs, "-names", "origin.allowed.test,127.0.0.1")
			if err != nil {
				return "", nil, err
			}
			fx.directHTTP, fx.directHTTPS = h, hs
			return "", p, waitTCP(hs)
		}},
		// A bare TCP relay to the origin, with no HTTP work: the ceiling
		// of every proxy in the plain-HTTP tests, since through any proxy
		// the origin shares the client CPU with the load generator while
		// the direct reference has a CPU of its own.
		{name: "relay", only: []string{"http", "http-c1", "tput-http"}, start: func() (string, *proc, error) {
			addr := freePort()
			p, err := o.spawn(o.serverCPU, "", filepath.Join(o.dir, "tcprelay"), "-listen", addr, "-to", fx.originHTTP)
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitTCP(addr)
		}},
		{name: "abox", start: func() (string, *proc, error) { return o.startProxy(abox, fx) }},
		// The same proxy tunnelling CONNECTs instead of intercepting them:
		// the bytes are only relayed, which bounds what interception can
		// reach on this machine.
		{name: "abox-tunnel", only: []string{"connect-ka", "tput-tls"}, start: func() (string, *proc, error) {
			return o.startProxy(abox, fx, "--no-mitm")
		}},
	}
	if sq, err := exec.LookPath("squid"); err == nil {
		httpTargets = append(httpTargets, target{name: "squid", byIP: true, start: func() (string, *proc, error) {
			addr := freePort()
			conf, err := o.squidConf(addr, fx)
			if err != nil {
				return "", nil, err
			}
			p, err := o.spawn(o.serverCPU, "", sq, "-N", "-f", conf)
			if err != nil {
				return "", nil, err
			}
			return addr, p, waitTCP(addr)
		}})
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
	for _, s := range []section{{httpTargets, httpTests}, {dnsTargets, dnsTests}} {
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
					if tg.only != nil && !slices.Contains(tg.only, t) {
						continue
					}
					res := o.measure(t, tg, addr, fx, p)
					res.target, res.round = tg.name, r
					log.Printf("round %d %-8s %-12s %9.0f/s  server %6.1f µs/op  client %.2f cores  p50 %s p99 %s  errors %d  late %d",
						r, tg.name, t, res.rate, res.cpuPerOp, res.clientCores, res.p50.Round(time.Microsecond), res.p99.Round(time.Microsecond), res.errors, res.late)
					results = append(results, res)
				}
				p.stop()
			}
		}
	}
	printTable(results, o.rounds)
	return nil
}

// startProxy starts abox http serve pinned to the server CPU, with extra
// flags, and returns its address.
func (o *options) startProxy(abox string, fx *fixtures, extra ...string) (string, *proc, error) {
	addr := freePort()
	args := append([]string{"http", "serve", "--listen", addr,
		"--upstream", fx.dns, "--allowlist", fx.allowlist, "--allow-host", "127.0.0.0/8", "--upstream-ca", fx.originCA,
		"--ca-dir", filepath.Join(o.dir, "ca"), "--ports", fx.ports, "--rate-limit", "0", "--log-file", filepath.Join(o.dir, "http.log")}, extra...)
	p, err := o.spawn(o.serverCPU, "SSL_CERT_FILE="+fx.originCA, abox, args...)
	if err != nil {
		return "", nil, err
	}
	return addr, p, waitTCP(addr)
}

type fixtures struct {
	dns, allowlist, zone, originCA string
	originHTTP, originHTTPS        string
	directHTTP, directHTTPS        string
	ports                          string
	procs                          []*proc
}

// clientCPU is the CPU time of the client side: this process (the load
// generator) and the fixtures.
func (f *fixtures) clientCPU() time.Duration {
	t := pidCPU("self")
	for _, p := range f.procs {
		t += p.cpu()
	}
	return t
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
	p, err = o.spawn(o.clientCPU, "", filepath.Join(o.dir, "testorigin"), "-http1", "-http", f.originHTTP, "-https", f.originHTTPS,
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

// squidConf writes a configuration making squid an allowlist forward proxy
// like the shared kit's (no cache, access log on, the origin's ports).
func (o *options) squidConf(addr string, fx *fixtures) (string, error) {
	dir := filepath.Join(o.dir, "squid")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", err
	}
	// squid started as root runs as its effective user (Debian: proxy),
	// which must reach its directory.
	if err := errors.Join(os.Chmod(o.dir, 0o711), os.Chmod(dir, 0o777)); err != nil {
		return "", err
	}
	_, hp, _ := net.SplitHostPort(fx.originHTTP)
	_, sp, _ := net.SplitHostPort(fx.originHTTPS)
	conf := fmt.Sprintf(`http_port %s
visible_hostname benchproc
pid_filename none
coredump_dir %[2]s
cache_log %[2]s/cache.log
access_log stdio:%[2]s/access.log
cache deny all
pinger_enable off
netdb_filename none
shutdown_lifetime 0 seconds
acl allowed dstdomain .allowed.test 127.0.0.1
acl origin_ports port %[3]s %[4]s
acl CONNECT method CONNECT
http_access deny !origin_ports
http_access deny CONNECT !origin_ports
http_access allow allowed
http_access deny all
`, addr, dir, hp, sp)
	p := filepath.Join(dir, "squid.conf")
	return p, os.WriteFile(p, []byte(conf), 0o644)
}
