package dnsfilter_test

import (
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/dnsfilter"
)

// burst sends every query of qs from c at once, without waiting, and then
// collects the answers until each was answered or the deadline passed. It
// returns the answers by ID and the IDs answered more than once.
func burst(t *testing.T, c net.PacketConn, to net.Addr, qs []*dns.Msg) (map[uint16]*dns.Msg, []uint16) {
	t.Helper()
	for _, q := range qs {
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteTo(b, to); err != nil {
			t.Fatal(err)
		}
	}
	got := map[uint16]*dns.Msg{}
	var dup []uint16
	buf := make([]byte, 65535)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for len(got) < len(qs) {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			break
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Errorf("unparsable answer: %v", err)
			continue
		}
		if _, seen := got[r.Id]; seen {
			dup = append(dup, r.Id)
		}
		got[r.Id] = r
	}
	// Anything late is a second answer.
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			break
		}
		r := new(dns.Msg)
		if r.Unpack(buf[:n]) == nil {
			dup = append(dup, r.Id)
		}
	}
	return got, dup
}

// TestBatchedServing: many clients bursting at once, with queries of every
// kind (blocked, allowed and cached, allowed and sent upstream, healthcheck,
// malformed) in the same batches: every query is answered exactly once,
// to the client that sent it, with its own ID and question, and the right
// rcode. With one P the socket is served through Go's poller (x/net's
// batches), with two it is detached (recvmmsg and sendmmsg of our own).
func TestBatchedServing(t *testing.T) {
	for _, procs := range []int{1, 2} {
		t.Run(fmt.Sprintf("GOMAXPROCS=%d", procs), func(t *testing.T) {
			defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
			testBatchedServing(t)
		})
	}
}

func testBatchedServing(t *testing.T) {
	h := start(t, harnessOptions{})
	h.ask(t, "example.com", dns.TypeA) // cached from here on
	to, err := net.ResolveUDPAddr("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	kinds := []struct {
		name  string
		qtype uint16
		rcode int
	}{
		{"other.org", dns.TypeA, dns.RcodeNameError},
		{"example.com", dns.TypeA, dns.RcodeSuccess},
		{"a.example.com", dns.TypeA, dns.RcodeSuccess},
		{"example.com", dns.TypeMX, dns.RcodeSuccess},
		{"healthcheck.abox.local", dns.TypeA, dns.RcodeSuccess},
		{"example.com", dns.TypeAXFR, dns.RcodeRefused},
		{"internal.example.com", dns.TypeA, dns.RcodeNameError},
	}
	const clients, perClient = 32, 8
	var wg sync.WaitGroup
	for w := range clients {
		wg.Go(func() {
			c, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			var qs []*dns.Msg
			for i := range perClient {
				k := kinds[(w+i)%len(kinds)]
				q := query(k.name, k.qtype, []uint16{0, 1232}[i%2])
				q.Id = uint16(w<<8 | i)
				qs = append(qs, q)
			}
			got, dup := burst(t, c, to, qs)
			if len(dup) > 0 {
				t.Errorf("client %d: IDs answered twice: %v", w, dup)
			}
			for i, q := range qs {
				r := got[q.Id]
				k := kinds[(w+i)%len(kinds)]
				switch {
				case r == nil:
					t.Errorf("client %d: %s %s (id %d) not answered", w, k.name, dns.TypeToString[k.qtype], q.Id)
				case r.Rcode != k.rcode || len(r.Question) != 1 || r.Question[0] != q.Question[0]:
					t.Errorf("client %d: %s %s: rcode %s question %v, want %s and the question asked", w, k.name, dns.TypeToString[k.qtype], rcode(r), r.Question, dns.RcodeToString[k.rcode])
				}
			}
		})
	}
	wg.Wait()
	if st := h.srv.Snapshot(); st.Queries != clients*perClient+1 {
		t.Errorf("queries counter %d, want %d", st.Queries, clients*perClient+1)
	}
}

// TestBatchedRateLimitPerClient: two clients flooding in the same batches
// each get their own budget, no more: a batch is no way around the limit,
// and one client's flood does not spend another's.
func TestBatchedRateLimitPerClient(t *testing.T) {
	clk := newClock()
	h := start(t, harnessOptions{tweak: func(c *dnsfilter.Config) {
		c.Now, c.RateLimit, c.RateBurst = clk.now, 2, 5
	}})
	to, err := net.ResolveUDPAddr("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		wg.Go(func() {
			c, err := net.ListenPacket("udp", src+":0")
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			var qs []*dns.Msg
			for i := range 20 {
				q := query(fmt.Sprintf("n%d.other.org", i), dns.TypeA, 1232)
				q.Id = uint16(i + 1)
				qs = append(qs, q)
			}
			got, _ := burst(t, c, to, qs)
			codes := map[string]int{}
			for _, r := range got {
				codes[rcode(r)]++
			}
			if len(got) != 20 || codes["NXDOMAIN"] != 5 || codes["REFUSED"] != 15 {
				t.Errorf("%s: %d answers, rcodes %v; want 20: 5 NXDOMAIN (the burst) and 15 REFUSED", src, len(got), codes)
			}
		})
	}
	wg.Wait()
}

// TestServesIPv6Socket: a socket bound to ::1 is served in batches too.
func TestServesIPv6Socket(t *testing.T) {
	pc, ln, err := dnsfilter.Listen("[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	pc.Close()
	ln.Close()
	h := start(t, harnessOptions{listen: "[::1]:0"})
	if r := h.ask(t, "example.com", dns.TypeA); rcode(r) != "NOERROR" || len(addrs(r)) != 1 {
		t.Errorf("over ::1: rcode %s, addresses %v; want NOERROR and one address", rcode(r), addrs(r))
	}
	if r := h.ask(t, "other.org", dns.TypeA); rcode(r) != "NXDOMAIN" {
		t.Errorf("over ::1: rcode %s, want NXDOMAIN", rcode(r))
	}
}

// TestUDPSocketReleasedOnStop: once Serve returns, the UDP socket is
// closed (its port can be bound again) and answers nothing more, whether
// it was served out of Go's poller (blocking, stopped by its receive
// timeout) or through it.
func TestUDPSocketReleasedOnStop(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(listen, func(t *testing.T) {
			if listen[0] == '[' {
				pc, err := net.ListenPacket("udp", listen)
				if err != nil {
					t.Skipf("no IPv6 loopback: %v", err)
				}
				pc.Close()
			}
			h := start(t, harnessOptions{listen: listen})
			if r := h.ask(t, "example.com", dns.TypeA); rcode(r) != "NOERROR" {
				t.Fatalf("before the stop: rcode %s, want NOERROR", rcode(r))
			}
			if err := h.stop(); err != nil {
				t.Fatal(err)
			}
			pc, err := net.ListenPacket("udp", h.addr)
			if err != nil {
				t.Fatalf("after Serve returned, the UDP port is still held: %v", err)
			}
			pc.Close()
		})
	}
}

// manyQuestions is a NOTIFY (an opcode whose header counts acceptQuery
// does not otherwise check) asking n questions of 250-byte names, and then
// a record that does not parse: a FORMERR that echoed the questions parsed
// before the error would be n×254 bytes.
func manyQuestions(n int) []byte {
	b := []byte{0x12, 0x34, dns.OpcodeNotify << 3, 0, 0, byte(n), 0, 1, 0, 0, 0, 0}
	label := make([]byte, 62)
	for i := range label {
		label[i] = 'a'
	}
	for range n {
		for range 4 {
			b = append(b, byte(len(label)))
			b = append(b, label...)
		}
		b = append(b, 0, 0, 1, 0, 1)
	}
	return append(b, 0xFF) // the answer record: a name pointer cut short
}

// TestManyQuestionsAnswerFits: whatever a datagram holds, the answer fits
// a UDP client that sent no EDNS (512 bytes), on the batched path and on
// miekg/dns's (a wildcard socket), and is a FORMERR for the query's ID.
func TestManyQuestionsAnswerFits(t *testing.T) {
	wire := manyQuestions(12)
	if new(dns.Msg).Unpack(wire) == nil {
		t.Fatal("the test datagram parses; it must fail after its questions")
	}
	for _, listen := range []string{"127.0.0.1:0", "0.0.0.0:0"} {
		t.Run(listen, func(t *testing.T) {
			h := start(t, harnessOptions{listen: listen})
			c, err := net.Dial("udp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(wire); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 65535)
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("no answer to a %d-byte datagram of 12 questions: %v", len(wire), err)
			}
			r := new(dns.Msg)
			if err := r.Unpack(buf[:n]); err != nil {
				t.Fatalf("answer does not parse: %v", err)
			}
			if n > dns.MinMsgSize || r.Id != 0x1234 || r.Rcode != dns.RcodeFormatError || len(r.Question) > 1 {
				t.Errorf("answer of %d bytes, id %#x, rcode %s, %d questions; want at most %d bytes, id 0x1234, FORMERR, at most one question",
					n, r.Id, dns.RcodeToString[r.Rcode], len(r.Question), dns.MinMsgSize)
			}
		})
	}
}

// TestReaderYieldsUnderLoad: a reader that always finds datagrams queued
// still gives up its P every few milliseconds (see readerYield); without
// that the runtime's monitor preempts it in the middle of a system call and
// hands its P to another thread.
func TestReaderYieldsUnderLoad(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	h := start(t, harnessOptions{})
	h.ask(t, "example.com", dns.TypeA) // cached from here on
	to, err := net.ResolveUDPAddr("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	before := dnsfilter.ReaderYields()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			c, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			// Bursts for well over the yield interval, each sent once the
			// last was answered: the reader is never idle for long.
			q, err := query("example.com", dns.TypeA, 0).Pack()
			if err != nil {
				t.Error(err)
				return
			}
			buf := make([]byte, 1500)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); {
				for range 8 {
					if _, err := c.WriteTo(q, to); err != nil {
						t.Error(err)
						return
					}
				}
				for range 8 {
					if _, _, err := c.ReadFrom(buf); err != nil {
						t.Errorf("client %d: %v", w, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if n := dnsfilter.ReaderYields() - before; n == 0 {
		t.Error("the reader never yielded in 200 ms of load")
	}
}
