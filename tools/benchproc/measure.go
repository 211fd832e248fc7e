package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// measure runs one closed-loop test against a started target: warm-up,
// then o.dur of load, reading the CPU of the target and of the client side
// (this process and the fixtures) before and after.
func (o *options) measure(test string, tg target, addr string, fx *fixtures, p *proc) result {
	workers := o.workers
	var op func(w int) func() error
	var moved atomic.Int64 // body bytes read in the window (throughput tests)
	var measuring atomic.Bool
	switch test {
	case "http", "http-c1", "connect-ka", "tput-http", "tput-tls":
		path := "/small"
		if strings.HasPrefix(test, "tput-") {
			path, workers = "/bytes/"+strconv.Itoa(tputBytes), 1
		} else if test == "http-c1" {
			workers = 1
		}
		url := "http://origin.allowed.test:" + port(fx.originHTTP) + path
		if test == "connect-ka" || test == "tput-tls" {
			url = "https://origin.allowed.test:" + port(fx.originHTTPS) + path
		}
		if addr == "" { // direct: the reference origin on the server CPU
			url = strings.Replace(strings.Replace(url, port(fx.originHTTP), port(fx.directHTTP), 1), port(fx.originHTTPS), port(fx.directHTTPS), 1)
		}
		if addr == "" || tg.byIP {
			url = strings.Replace(url, "origin.allowed.test", "127.0.0.1", 1)
		}
		op = func(int) func() error { return httpWorker(addr, url, &moved, &measuring) }
	case "dns-blocked", "dns-cached":
		op = func(w int) func() error { return dnsWorker(addr, test == "dns-blocked", w) }
	default:
		return result{test: test, errors: -1}
	}
	ws := make([]func() error, workers)
	for i := range ws {
		ws[i] = op(i)
	}
	var stopped atomic.Bool
	var mu sync.Mutex
	var lat []time.Duration
	var errs, late atomic.Int64
	var wg sync.WaitGroup
	for _, w := range ws {
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
	c0, cl0, b0, t0 := p.cpu(), fx.clientCPU(), machineBusy(), time.Now()
	measuring.Store(true)
	time.Sleep(o.dur)
	measuring.Store(false)
	c1, cl1, b1, el := p.cpu(), fx.clientCPU(), machineBusy(), time.Since(t0)
	stopped.Store(true)
	wg.Wait()
	slices.Sort(lat)
	res := result{test: test, errors: int(errs.Load()), late: int(late.Load()), clientCores: (cl1 - cl0).Seconds() / el.Seconds(),
		otherCores: ((b1 - b0) - (c1 - c0) - (cl1 - cl0)).Seconds() / el.Seconds()}
	if n := len(lat); n > 0 {
		res.p50, res.p99 = lat[n/2], lat[n*99/100]
	}
	ops := float64(len(lat))
	if strings.HasPrefix(test, "tput-") {
		ops = float64(moved.Load()) / 1e6 // per MB
		res.perMB = true
	}
	if ops > 0 {
		res.rate = ops / el.Seconds()
		res.cpuPerOp = float64((c1 - c0).Microseconds()) / ops
	}
	return res
}

// tputBytes is the body of a throughput test's download, as in the shared
// kit (256 MiB); a download straddling the window counts the bytes that
// arrived inside it.
const tputBytes = 256 << 20

func port(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }

// httpWorker returns one keep-alive client issuing GETs of target: one
// connection, or through a proxy one CONNECT tunnel with one TLS session,
// HTTP/1.1, a prebuilt request and net/http's response reader, so the load
// generator costs little next to the server. Body bytes read while
// measuring are added to moved. A broken connection is dialled again at the
// next call.
func httpWorker(proxy, target string, moved *atomic.Int64, measuring *atomic.Bool) func() error {
	u, err := url.Parse(target)
	if err != nil {
		return func() error { return err }
	}
	reqTarget := u.RequestURI()
	if proxy != "" && u.Scheme == "http" {
		reqTarget = u.String()
	}
	req := []byte("GET " + reqTarget + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: benchproc\r\n\r\n")
	var conn net.Conn
	var br *bufio.Reader
	buf := make([]byte, 256<<10)
	dial := func() error {
		addr := u.Host
		if proxy != "" {
			addr = proxy
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if u.Scheme == "https" {
			if proxy != "" {
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %[1]s\r\n\r\n", u.Host)
				resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1), &http.Request{Method: http.MethodConnect})
				if err != nil || resp.StatusCode != http.StatusOK {
					c.Close()
					return fmt.Errorf("CONNECT: %v %v", resp, err)
				}
			}
			tc := tls.Client(c, &tls.Config{ServerName: u.Hostname(), InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
			if err := tc.Handshake(); err != nil {
				c.Close()
				return err
			}
			c = tc
		}
		conn, br = c, bufio.NewReaderSize(c, 64<<10)
		return nil
	}
	return func() error {
		if conn == nil {
			if err := dial(); err != nil {
				return err
			}
		}
		err := func() error {
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := conn.Write(req); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			for {
				n, err := resp.Body.Read(buf)
				if measuring.Load() {
					moved.Add(int64(n))
				}
				if err == io.EOF {
					break
				}
				if err != nil {
					return err
				}
			}
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			if resp.Close {
				return errors.New("the server closed the connection")
			}
			return nil
		}()
		if err != nil {
			conn.Close()
			conn = nil
		}
		return err
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
	fmt.Println("| test | target | rate/s | vs ref | server µs/op | client cores | other busy | p50 | p99 | errors | late |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, k := range order {
		var rate, ratio, cpu, client, other, p50, p99 []float64
		unit, opUnit := "/s", "µs/op"
		errs, late := 0, 0
		for _, r := range by[k] {
			late += r.late
			rate = append(rate, r.rate)
			cpu = append(cpu, r.cpuPerOp)
			client = append(client, r.clientCores)
			other = append(other, r.otherCores)
			if r.perMB {
				unit, opUnit = " MB/s", "µs/MB"
			}
			p50 = append(p50, float64(r.p50.Microseconds())/1000)
			p99 = append(p99, float64(r.p99.Microseconds())/1000)
			if rr := ref[k.test][r.round]; rr > 0 {
				ratio = append(ratio, r.rate/rr)
			}
			errs += r.errors
		}
		fmt.Printf("| %s | %s | %.0f%s | %.2f | %.1f %s | %.2f | %.2f | %.2f ms | %.2f ms | %d | %d |\n", k.test, k.target, median(rate), unit, median(ratio), median(cpu), opUnit, median(client), median(other), median(p50), median(p99), errs, late)
	}
	fmt.Println("\nclient cores: CPU of the load generator and the fixtures (one core): near 1.00 the client side, not the target, was the limit.")
	fmt.Println("Through a proxy the origin shares that core with the load generator, while the direct reference has it alone: that caps any proxy's ratio.")
	fmt.Println("relay (a bare TCP relay, no HTTP work) and abox-tunnel (CONNECT bytes relayed, not intercepted) measure that cap in the same round.")
	fmt.Println("other busy: the machine's busy cores not accounted to either (other tenants): well above 0 the figures are noisy.")
	fmt.Println("errors: no answer within 250 ms. late: the answer was there but the load generator read it past its deadline.")
	fmt.Println("Either comes in bursts of one per worker (32) when one side is held up for longer than 250 ms on a busy machine.")
}

// machineBusy is the CPU time all cores spent busy (not idle or waiting
// for I/O), from /proc/stat.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal
	var busy int64
	for i, v := range f[1:min(len(f), 9)] {
		if i == 3 || i == 4 {
			continue
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		busy += n
	}
	return time.Duration(busy) * time.Second / 100 // USER_HZ
}
