package httpfilter

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
)

// portDialer stands in for the internet: the proxy dials the address it
// checked (NAME's address, port 80 or 443), and the test's origins listen
// on loopback ports, so each checked address:port is mapped to an origin.
// Every address asked for is recorded.
type portDialer struct {
	to    map[string]string
	mu    sync.Mutex
	asked []string
	d     net.Dialer
}

func (p *portDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	p.mu.Lock()
	p.asked = append(p.asked, addr)
	p.mu.Unlock()
	to, ok := p.to[addr]
	if !ok {
		return nil, fmt.Errorf("test dialer: nothing at %s", addr)
	}
	return p.d.DialContext(ctx, network, to)
}

func (p *portDialer) dialed() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.asked...)
}

// guestChose is the destination every captured test connection claims to
// have had: an address the allowed names never resolve to.
var guestChose = netip.MustParseAddr("192.0.2.7")

// captureHarness is the real proxy with capture servers on ports 80 and
// 443 in front of it; allowed.test (allowlisted) and other.test resolve
// to 127.0.0.1, whose ports 80 and 443 are the test's origins.
func captureHarness(t *testing.T) (h *harness, addr map[uint16]string, d *portDialer) {
	t.Helper()
	return captureHarnessWith(t, hopts{})
}

// captureHarnessWith is captureHarness with o (its allow and upDialer
// are set here).
func captureHarnessWith(t *testing.T, o hopts) (h *harness, addr map[uint16]string, d *portDialer) {
	t.Helper()
	tlsO := newHTTPSOrigin(t, originMux())
	plainO := newHTTPOrigin(t, originMux())
	d = &portDialer{to: map[string]string{
		"127.0.0.1:443": tlsO.Listener.Addr().String(),
		"127.0.0.1:80":  plainO.Listener.Addr().String(),
	}}
	o.allow, o.upDialer = []string{"allowed.test"}, d
	h = newHarness(t, o)
	h.res.set("allowed.test", "127.0.0.1")
	h.res.set("other.test", "127.0.0.1")
	addr = map[uint16]string{}
	for _, pt := range []uint16{80, 443} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c, err := h.p.NewCapture(ln, pt)
		if err != nil {
			t.Fatal(err)
		}
		c.origDst = func(net.Conn) (netip.AddrPort, error) { return netip.AddrPortFrom(guestChose, pt), nil }
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Serve(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("capture Serve: %v", err)
			}
		})
		addr[pt] = ln.Addr().String()
	}
	return h, addr, d
}

// capturedGet sends GET / with Host host on conn and reads the answer.
func capturedGet(t *testing.T, conn net.Conn, host string) (*http.Response, echoReply) {
	t.Helper()
	if _, err := io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	var e echoReply
	b, _ := io.ReadAll(resp.Body)
	json.Unmarshal(b, &e)
	return resp, e
}

// A client that ignores the proxy and speaks TLS to some address's port
// 443 is intercepted as a CONNECT to its SNI: the proxy's CA signs what
// it sees, the request reaches the name's checked address (not the one
// the guest chose, which is only logged), and the lines say so.
func TestCaptureTLSAllowedSNIIntercepted(t *testing.T) {
	h, addr, d := captureHarness(t)
	conn, err := tls.Dial("tcp", addr[443], &tls.Config{ServerName: "allowed.test", RootCAs: h.proxyCA, NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatalf("TLS to the capture port, trusting only the proxy's CA: %v", err)
	}
	resp, e := capturedGet(t, conn, "allowed.test")
	conn.Close()
	if resp.StatusCode != 200 || e.Host != "allowed.test" || e.Path != "/x" {
		t.Fatalf("answer %d from host %q path %q, want 200 from the origin for allowed.test/x", resp.StatusCode, e.Host, e.Path)
	}
	if got := d.dialed(); len(got) != 1 || got[0] != "127.0.0.1:443" {
		t.Errorf("dialled %q, want only allowed.test's checked address 127.0.0.1:443 (never the guest's %s)", got, guestChose)
	}
	waitFor(t, func() bool { return h.lastLog("mode", "mitm") != nil }, "the CONNECT's line")
	waitFor(t, func() bool { return h.lastLog("kind", "capture") != nil }, "the capture line")
	if l := h.lastLog("kind", "capture"); l == nil || l["orig_dst"] != "192.0.2.7:443" || l["host"] != "allowed.test" || l["opened"] != true {
		t.Errorf("capture line %v, want host allowed.test, orig_dst 192.0.2.7:443, opened", l)
	}
	if l := h.lastLog("mode", "mitm"); l["host"] != "allowed.test" || l["verdict"] != "allow" {
		t.Errorf("CONNECT line %v, want allowed.test allowed", l)
	}
}

// What capture refuses on port 443: a name not allowlisted (decided by
// the proxy), a ClientHello without SNI and bytes that are not TLS.
// Nothing is dialled and the client sees a closed handshake.
func TestCaptureTLSRefused(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		msg          string // in the client's error
		send         func(addr string) error
	}{
		{"sni not allowed", "not_allowlisted", "access denied", func(a string) error {
			c, err := tls.Dial("tcp", a, &tls.Config{ServerName: "other.test", InsecureSkipVerify: true})
			if err == nil {
				c.Close()
			}
			return err
		}},
		{"no sni", ReasonCaptureNoSNI, "access denied", func(a string) error {
			// InsecureSkipVerify without ServerName: Go sends no SNI.
			c, err := tls.Dial("tcp", a, &tls.Config{InsecureSkipVerify: true})
			if err == nil {
				c.Close()
			}
			return err
		}},
		{"not tls", ReasonCaptureNotTLS, "", func(a string) error {
			c, err := net.Dial("tcp", a)
			if err != nil {
				return err
			}
			defer c.Close()
			io.WriteString(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
			b, _ := io.ReadAll(c)
			if strings.Contains(string(b), "200") {
				return nil
			}
			return fmt.Errorf("closed after %q", b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, addr, d := captureHarness(t)
			err := tc.send(addr[443])
			if err == nil {
				t.Fatal("handshake succeeded, want it refused")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("client error %q, want it to say %q", err, tc.msg)
			}
			waitFor(t, func() bool { return h.lastLog("reason", tc.reason) != nil }, "a line with reason "+tc.reason)
			if l := h.lastLog("reason", tc.reason); l["verdict"] != "block" {
				t.Errorf("line %v, want a block", l)
			}
			if got := d.dialed(); len(got) != 0 {
				t.Errorf("dialled %q, want nothing", got)
			}
		})
	}
}

// Plain HTTP to some address's port 80 is decided on its Host: allowed
// names reach their checked address; the rest gets no HTTP answer (a
// client that did not ask the proxy would take a 403 for success) but a
// reset, and the line carries the reason.
func TestCapturePlain(t *testing.T) {
	for _, tc := range []struct {
		name, request string
		reason        string // "": answered 200 by the origin
		dialled       []string
	}{
		{"allowed host", "GET /x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", []string{"127.0.0.1:80"}},
		{"host not allowed", "GET /x HTTP/1.1\r\nHost: other.test\r\n\r\n", "not_allowlisted", nil},
		{"no host", "GET /x HTTP/1.0\r\n\r\n", ReasonCaptureNoHost, nil},
		{"address as host", "GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", ReasonCaptureAddressName, nil},
		{"not http", "\x16\x03\x01\x00\x05hello\r\n\r\n", ReasonCaptureNotHTTP, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, addr, d := captureHarness(t)
			conn, err := net.Dial("tcp", addr[80])
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			io.WriteString(conn, tc.request)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("reading the answer: %v", err)
			case tc.reason == "" && resp.StatusCode != 200:
				t.Errorf("answer %d, want 200", resp.StatusCode)
			case tc.reason != "" && err == nil:
				t.Errorf("answered %d (reason %q), want the connection reset", resp.StatusCode, resp.Header.Get("X-Abox-Reason"))
			}
			if got := d.dialed(); strings.Join(got, ",") != strings.Join(tc.dialled, ",") {
				t.Errorf("dialled %q, want %q", got, tc.dialled)
			}
			if tc.reason != "" {
				waitFor(t, func() bool { return h.lastLog("reason", tc.reason) != nil }, "a line with reason "+tc.reason)
			}
		})
	}
}

// One captured connection is one name: a later request for another host
// on it is refused as fronting, as inside a CONNECT.
func TestCapturePlainSecondHostIsFronting(t *testing.T) {
	h, addr, _ := captureHarness(t)
	conn, err := net.Dial("tcp", addr[80])
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	for i, host := range []string{"allowed.test", "other.test"} {
		io.WriteString(conn, "GET /x HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want := 200
		if i == 1 {
			want = 403
		}
		if resp.StatusCode != want {
			t.Fatalf("request %d for %s: %d, want %d", i, host, resp.StatusCode, want)
		}
	}
	waitFor(t, func() bool { return h.lastLog("reason", ReasonDomainFronting) != nil }, "the fronting refusal's line")
}

// A guest looping on refused captured connections writes the refusal
// budget's worth of capture lines, not one per connection: they are
// refusals' lines, folded like the refusals themselves.
func TestCaptureRefusedLinesFolded(t *testing.T) {
	h, addr, _ := captureHarnessWith(t, hopts{decisions: true})
	const n = 200
	for range n {
		conn, err := net.Dial("tcp", addr[80])
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
		io.ReadAll(conn)
		conn.Close()
	}
	waitFor(t, func() bool { h.lines.Sync(); return strings.Contains(h.log.String(), "refusals aggregated") }, "the aggregated refusals line")
	captures := 0
	for _, l := range h.log.lines() {
		if l["msg"] == "capture" {
			captures++
			if l["opened"] != false {
				t.Errorf("refused connection's capture line %v, want opened false", l)
			}
		}
	}
	t.Logf("%d refused captured connections: %d capture lines written", n, captures)
	if captures == 0 || captures > n/4 {
		t.Errorf("%d capture lines for %d refused connections, want a few (the refusal budget)", captures, n)
	}
}
