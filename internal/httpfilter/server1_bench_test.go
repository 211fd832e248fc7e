package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkKeepAlive: one guest connection sends GET after GET through
// the proxy (plain HTTP, and inside an intercepted tunnel) to a raw
// HTTP/1.1 origin; the client and the origin allocate almost nothing, so
// allocs/op is about the proxy's own per-request allocations. For a CPU
// profile of the proxy's side: -cpuprofile, then pprof -focus httpfilter.
func BenchmarkKeepAlive(b *testing.B) {
	for _, inTunnel := range []bool{false, true} {
		b.Run(map[bool]string{false: "plain", true: "intercepted"}[inTunnel], func(b *testing.B) {
			h := newHarness(b, hopts{allow: []string{"origin.test"}, decisions: true, rate: -1})
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			if inTunnel {
				leaf, err := testOriginCA(b).Leaf("origin.test")
				if err != nil {
					b.Fatal(err)
				}
				ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}})
			}
			serveRaw(b, ln, rawOrigin)
			_, pt, _ := net.SplitHostPort(ln.Addr().String())
			h.allowOrigin("origin.test", nil, pt)
			host := "origin.test:" + pt
			var c net.Conn
			req := "GET http://" + host + "/bench HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: bench\r\nAccept: */*\r\n\r\n"
			if inTunnel {
				tc := tls.Client(h.connect(b, host), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
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
			body := make([]byte, 4096)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := io.WriteString(c, req); err != nil {
					b.Fatal(err)
				}
				n, err := readRawResponse(br)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(br, body[:n]); err != nil {
					b.Fatal(err)
				}
				if n != 2 {
					b.Fatalf("answer %q, want the origin's", body[:n])
				}
			}
		})
	}
}

// rawOrigin answers every GET on c with a fixed 200.
func rawOrigin(c net.Conn, br *bufio.Reader) {
	const resp = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nDate: Tue, 01 Dec 2026 20:00:00 GMT\r\nContent-Length: 2\r\n\r\nok"
	for {
		if _, err := readRawResponse(br); err != nil { // a request header: the same loop
			return
		}
		if _, err := io.WriteString(c, resp); err != nil {
			return
		}
	}
}

// readRawResponse reads a header block and returns its Content-Length.
func readRawResponse(br *bufio.Reader) (int, error) {
	n := 0
	for first := true; ; first = false {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(l) <= 2 {
			if first {
				return 0, fmt.Errorf("empty header")
			}
			return n, nil
		}
		if k, v, ok := strings.Cut(string(l), ":"); ok && strings.EqualFold(k, "Content-Length") {
			n, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
}
