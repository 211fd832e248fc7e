package httpfilter

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

// rawRequest sends raw bytes to the proxy and returns the parsed response.
func (h *harness) rawRequest(t *testing.T, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading response to %q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func checkRefusal(t *testing.T, resp *http.Response, body string, wantStatus int, wantReason, host string) {
	t.Helper()
	if resp.StatusCode != wantStatus {
		t.Errorf("status = %d, want %d (body %q)", resp.StatusCode, wantStatus, body)
	}
	if got := resp.Header.Get("X-Abox-Reason"); got != wantReason {
		t.Errorf("X-Abox-Reason = %q, want %q", got, wantReason)
	}
	if wantStatus == http.StatusOK {
		return
	}
	id := resp.Header.Get("X-Abox-Denial-Id")
	if id == "" {
		t.Errorf("no X-Abox-Denial-Id")
	}
	if !strings.Contains(body, wantReason) || !strings.Contains(body, id) || (host != "" && !strings.Contains(body, host)) {
		t.Errorf("body %q does not name host %q, reason %q and denial id %q", body, host, wantReason, id)
	}
}

// checkNameRefusal is checkRefusal for a name that resolved somewhere the
// guest may not reach: the guest is told forbidden_address, whatever the
// range, and the decision line of that denial id keeps the precise reason.
func (h *harness) checkNameRefusal(t *testing.T, resp *http.Response, body, logReason, host string) {
	t.Helper()
	checkRefusal(t, resp, body, http.StatusForbidden, policy.ReasonForbiddenAddress, host)
	if strings.Contains(body, ": "+logReason+" (") {
		t.Errorf("the guest was told %q: %q", logReason, body)
	}
	id := resp.Header.Get("X-Abox-Denial-Id")
	waitFor(t, func() bool { return h.lastLog("denial_id", id) != nil }, "the denial's decision line")
	if l := h.lastLog("denial_id", id); l["reason"] != logReason {
		t.Errorf("decision line of denial %s: reason %v, want %s", id, l["reason"], logReason)
	}
}

// TestBlockedRangesByName: an allowlisted name resolving into any blocked
// range is refused, over plain HTTP and CONNECT, with the range as reason.
func TestBlockedRangesByName(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"*.e.test"}, permit: []string{}, hostAddrs: []string{"93.184.0.9"}})
	ranges := []struct{ addr, reason string }{
		{"0.0.0.1", "unspecified"}, {"10.1.2.3", "private"}, {"172.16.5.4", "private"}, {"192.168.0.1", "private"},
		{"100.64.1.1", "cgnat"}, {"127.0.0.1", "loopback"}, {"169.254.169.254", "metadata"}, {"169.254.1.1", "link_local"}, {"168.63.129.16", "metadata"},
		{"192.0.0.8", "ietf_protocol"}, {"192.0.2.1", "documentation"}, {"198.51.100.2", "documentation"},
		{"203.0.113.3", "documentation"}, {"198.18.0.1", "benchmarking"}, {"224.0.0.251", "multicast"},
		{"240.0.0.1", "reserved"}, {"255.255.255.255", "broadcast"}, {"192.88.99.1", "relay_6to4"},
		{"::", "unspecified"}, {"::1", "loopback"}, {"fe80::1", "link_local"}, {"fd00::1", "unique_local"},
		{"ff02::1", "multicast"}, {"2001:db8::1", "documentation"}, {"::ffff:10.0.0.1", "private"},
		{"::127.0.0.1", "loopback"}, {"64:ff9b::a9fe:a9fe", "metadata"}, {"64:ff9b::a83f:8110", "metadata"}, {"64:ff9b:1::1", "embedded_v4"},
		{"2002:c0a8:101::1", "private"}, {"2001:0:808:808::80ff:fffe", "loopback"},
		{"93.184.0.9", "host_address"},
	}
	for i, r := range ranges {
		name := fmt.Sprintf("r%d.e.test", i)
		h.res.set(name, r.addr)
		t.Run(r.addr+"/http", func(t *testing.T) {
			resp, body := h.rawRequest(t, "GET http://"+name+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n")
			h.checkNameRefusal(t, resp, body, r.reason, name)
		})
		t.Run(r.addr+"/connect", func(t *testing.T) {
			resp, body := h.rawRequest(t, "CONNECT "+name+":443 HTTP/1.1\r\nHost: "+name+":443\r\n\r\n")
			h.checkNameRefusal(t, resp, body, r.reason, name)
		})
	}
	t.Run("mixed public and private answer", func(t *testing.T) {
		h.res.set("mixed.e.test", "8.8.8.8", "10.0.0.1")
		resp, body := h.rawRequest(t, "GET http://mixed.e.test/ HTTP/1.1\r\nHost: mixed.e.test\r\n\r\n")
		h.checkNameRefusal(t, resp, body, "private", "mixed.e.test")
	})
}

// TestBlockedLiterals: every literal notation of a blocked address is
// classified, never resolved; passive mode changes nothing.
func TestBlockedLiterals(t *testing.T) {
	for _, passive := range []bool{false, true} {
		h := newHarness(t, hopts{passive: passive, permit: []string{}})
		lits := []struct{ host, reason string }{
			{"127.0.0.1", "loopback"},
			{"127.0.0.1.", "loopback"}, {"[::1]", "loopback"},
			{"[::ffff:127.0.0.1]", "loopback"}, {"[::ffff:7f00:1]", "loopback"}, {"[fe80::1%25eth0]", "link_local"},
			{"169.254.169.254", "metadata"}, {"168.63.129.16", "metadata"},
			{"[64:ff9b::7f00:1]", "loopback"}, {"[2002:7f00:1::1]", "loopback"}, {"[fd00::1]", "unique_local"},
			{"192.168.1.1", "private"}, {"100.64.0.1", "cgnat"},
		}
		for _, l := range lits {
			t.Run(fmt.Sprintf("passive=%v/%s", passive, l.host), func(t *testing.T) {
				resp, body := h.rawRequest(t, "GET http://"+l.host+"/ HTTP/1.1\r\nHost: x\r\n\r\n")
				checkRefusal(t, resp, body, 403, l.reason, "")
				resp, body = h.rawRequest(t, "CONNECT "+l.host+":443 HTTP/1.1\r\nHost: x\r\n\r\n")
				checkRefusal(t, resp, body, 403, l.reason, "")
			})
		}
		// Ambiguous notations are refused as invalid, never guessed at,
		// whatever address they would mean and in every mode. (The
		// 192.0.2.1 forms stand for public ones: a broken parser refuses
		// them as documentation instead of dialling out.)
		for _, host := range []string{"2130706433", "0177.0.0.1", "0x7f.1", "0x7f000001", "127.1", "017700000001",
			"0xa9fea9fe", "10.1", "0", "0xc0000201", "192.0.513", "0300.0.2.1", "0xc0.0.2.1", "192.0.02.1"} {
			t.Run(fmt.Sprintf("passive=%v/ambiguous %s", passive, host), func(t *testing.T) {
				resp, body := h.rawRequest(t, "GET http://"+host+"/ HTTP/1.1\r\nHost: x\r\n\r\n")
				checkRefusal(t, resp, body, 400, ReasonInvalidTarget, "")
				resp, body = h.rawRequest(t, "CONNECT "+host+":443 HTTP/1.1\r\nHost: x\r\n\r\n")
				checkRefusal(t, resp, body, 400, ReasonInvalidTarget, "")
			})
		}
		t.Run(fmt.Sprintf("passive=%v/percent-encoded", passive), func(t *testing.T) {
			// net/http refuses a percent-encoded host before the proxy
			// sees it; inside a tunnel the proxy's parser decodes it (see
			// egress tests). Either way it must not get through.
			for _, raw := range []string{"GET http://127%2E0%2E0%2E1/ HTTP/1.1\r\nHost: x\r\n\r\n", "CONNECT 127%2E0%2E0%2E1:443 HTTP/1.1\r\nHost: x\r\n\r\n"} {
				if resp, body := h.rawRequest(t, raw); resp.StatusCode != 400 && resp.StatusCode != 403 {
					t.Errorf("%q: status %d %q, want a refusal", raw, resp.StatusCode, body)
				}
			}
		})
		t.Run(fmt.Sprintf("passive=%v/invalid numeric", passive), func(t *testing.T) {
			for _, bad := range []string{"256.0.0.1", "0x1g.1", "08.1", "1.2.3.4.5", "4294967296"} {
				resp, body := h.rawRequest(t, "CONNECT "+bad+":443 HTTP/1.1\r\nHost: x\r\n\r\n")
				checkRefusal(t, resp, body, 400, ReasonInvalidTarget, "")
			}
		})
		h.res.mu.Lock()
		if len(h.res.calls) != 0 {
			t.Errorf("resolver was asked %v; literals must never be resolved", h.res.calls)
		}
		h.res.mu.Unlock()
	}
}

// TestRebinding: the name answers an allowed address, then a private one.
// The proxy looks it up once per request and dials the checked address.
func TestRebinding(t *testing.T) {
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"rebind.test"}, dialer: d})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	h.res.sequence("rebind.test", []netip.Addr{netip.MustParseAddr("127.0.0.1")}, []netip.Addr{netip.MustParseAddr("127.0.0.2")})
	resp, err := h.client(false).Get("http://rebind.test:" + pt + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d, want 200", resp.StatusCode)
	}
	if got := h.res.count("rebind.test"); got != 1 {
		t.Errorf("lookups = %d, want 1", got)
	}
	if got := d.dialed(); len(got) != 1 || got[0] != "127.0.0.1:"+pt {
		t.Errorf("dialled %v, want [127.0.0.1:%s]", got, pt)
	}
	// The next request sees the private answer and is refused.
	resp, body := h.rawRequest(t, "GET http://rebind.test:"+pt+"/ HTTP/1.1\r\nHost: rebind.test\r\n\r\n")
	h.checkNameRefusal(t, resp, body, "loopback", "rebind.test")
}

// TestResolveOnceThroughUpstream uses the real upstream client against an
// in-process DNS server: one CONNECT-less request means one A and one AAAA
// query, and nothing else.
func TestResolveOnceThroughUpstream(t *testing.T) {
	dns := fakedns.StartT(t)
	dns.Add("origin.test. 60 IN A 127.0.0.1")
	up, err := upstream.New(upstream.Config{Servers: []string{dns.Addr}, Timeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"origin.test"}, resolver: up, dialer: d})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	resp, err := h.client(false).Get("http://origin.test:" + pt + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := dns.CountFor("origin.test"); got < 1 || got > 2 {
		t.Errorf("upstream saw %d queries for origin.test, want one lookup (A and AAAA)", got)
	}
	if got := d.dialed(); len(got) != 1 || got[0] != "127.0.0.1:"+pt {
		t.Errorf("dialled %v", got)
	}
}

func TestPortPolicy(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	h.res.set("origin.test", "127.0.0.1")
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	tests := []struct {
		name, raw string
		want      int
		reason    string
	}{
		{"http off-policy port", "GET http://origin.test:" + pt + "/ HTTP/1.1\r\nHost: origin.test\r\n\r\n", 403, ReasonPortNotAllowed},
		{"connect off-policy port", "CONNECT origin.test:22 HTTP/1.1\r\nHost: origin.test:22\r\n\r\n", 403, ReasonPortNotAllowed},
		{"connect without port", "CONNECT origin.test HTTP/1.1\r\nHost: origin.test\r\n\r\n", 400, ReasonInvalidTarget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := h.rawRequest(t, tt.raw)
			checkRefusal(t, resp, body, tt.want, tt.reason, "")
		})
	}
	t.Run("allowed once listed", func(t *testing.T) {
		h.p.ports[uint16(mustAtoi(pt))] = true
		resp, _ := h.rawRequest(t, "GET http://origin.test:"+pt+"/ HTTP/1.1\r\nHost: origin.test\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Errorf("status %d, want 200", resp.StatusCode)
		}
	})
}

func TestAllowlistAndPassive(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	h.res.set("origin.test", "127.0.0.1")
	h.res.set("other.test", "127.0.0.1")
	h.res.set("private.test", "10.0.0.1")
	get := func(host string) (*http.Response, string) {
		return h.rawRequest(t, "GET http://"+host+":"+pt+"/ HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
	}
	resp, body := get("other.test")
	checkRefusal(t, resp, body, 403, "not_allowlisted", "other.test")
	if h.res.count("other.test") != 0 {
		t.Errorf("a name that is not allowlisted was resolved")
	}
	h.engine.SetMode(policy.Passive)
	resp, body = get("other.test")
	if resp.StatusCode != 200 {
		t.Errorf("passive: status %d, want 200: %s", resp.StatusCode, body)
	}
	resp, body = get("private.test")
	h.checkNameRefusal(t, resp, body, "private", "private.test")
	found := false
	for _, e := range h.engine.Profile().Entries {
		found = found || e.Name == "other.test"
	}
	if !found {
		t.Errorf("passive profile %+v lacks other.test", h.engine.Profile().Entries)
	}
	waitFor(t, func() bool { return h.lastLog("reason", policy.ReasonPassive) != nil }, "a passive_mode log line")
}

// TestHealthcheck answers on every path, in every mode, without a lookup
// or a connection.
func TestHealthcheck(t *testing.T) {
	modes := []struct {
		name string
		o    hopts
	}{
		{"mitm", hopts{}},
		{"no-mitm", hopts{noMITM: true}},
		{"exception", hopts{exceptions: []string{"healthcheck.abox.local"}}},
		{"passive", hopts{passive: true}},
	}
	for _, m := range modes {
		m.o.dialer = &recordingDialer{}
		h := newHarness(t, m.o)
		for _, path := range []struct {
			name string
			url  string
			h2   bool
		}{
			{"http", "http://healthcheck.abox.local/", false},
			{"https h1", "https://healthcheck.abox.local/", false},
			{"https h2", "https://healthcheck.abox.local/", true},
			{"https other port", "https://healthcheck.abox.local:8443/x", false},
		} {
			t.Run(m.name+"/"+path.name, func(t *testing.T) {
				resp, err := h.client(path.h2).Get(path.url)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != healthBody || resp.Header.Get("X-Abox-Reason") != "healthcheck" {
					t.Errorf("got %d %q %v, want 200 %q", resp.StatusCode, b, resp.Header, healthBody)
				}
				if path.h2 && resp.ProtoMajor != 2 {
					t.Errorf("proto %s, want HTTP/2", resp.Proto)
				}
			})
		}
		if n := len(m.o.dialer.dialed()); n != 0 {
			t.Errorf("%s: healthcheck dialled %d connections", m.name, n)
		}
		h.res.mu.Lock()
		if len(h.res.calls) != 0 {
			t.Errorf("%s: healthcheck resolved %v", m.name, h.res.calls)
		}
		h.res.mu.Unlock()
	}
}

func TestNotAProxyRequest(t *testing.T) {
	h := newHarness(t, hopts{})
	tests := []struct {
		name, raw string
		reason    string
	}{
		{"origin form", "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n", ReasonNotProxyRequest},
		{"https absolute", "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", ReasonHTTPSInAbsolute},
		{"userinfo", "GET http://a:b@example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", ReasonUserinfo},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := h.rawRequest(t, tt.raw)
			if resp.StatusCode != 400 || resp.Header.Get("X-Abox-Reason") != tt.reason {
				t.Errorf("got %d %q, want 400 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), tt.reason)
			}
			if !strings.Contains(body, "abox proxy") {
				t.Errorf("body %q is not a clear explanation", body)
			}
		})
	}
}

func TestUpstreamFailures(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"*.e.test"}})
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	cport := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	// An HTTPS origin whose certificate no configured root signs.
	bad := newHTTPOrigin(t, originMux())
	badTLS := tlsOriginWithSelfSigned(t)
	h.res.set("down.e.test", "127.0.0.1")
	h.res.set("badcert.e.test", "127.0.0.1")
	h.p.ports[uint16(cport)] = true
	h.p.ports[uint16(mustAtoi(port(t, bad)))] = true
	h.p.ports[uint16(mustAtoi(port(t, badTLS)))] = true
	t.Run("connection refused", func(t *testing.T) {
		resp, body := h.rawRequest(t, fmt.Sprintf("GET http://down.e.test:%d/ HTTP/1.1\r\nHost: down.e.test\r\n\r\n", cport))
		checkRefusal(t, resp, body, 502, ReasonUpstreamConnect, "down.e.test")
		if strings.Contains(body, "dial") || strings.Contains(body, "refused") {
			t.Errorf("body leaks an internal error: %q", body)
		}
	})
	t.Run("unresolvable", func(t *testing.T) {
		resp, body := h.rawRequest(t, "GET http://nx.e.test/ HTTP/1.1\r\nHost: nx.e.test\r\n\r\n")
		checkRefusal(t, resp, body, 502, "resolve_failed", "nx.e.test")
		if strings.Contains(body, "no such host") {
			t.Errorf("body leaks the resolver error: %q", body)
		}
	})
	t.Run("untrusted upstream certificate", func(t *testing.T) {
		resp, err := h.client(false).Get("https://badcert.e.test:" + port(t, badTLS) + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkRefusal(t, resp, string(b), 502, ReasonUpstreamTLS, "badcert.e.test")
		if strings.Contains(string(b), "x509") {
			t.Errorf("body leaks the TLS error: %q", b)
		}
	})
}

// tlsOriginWithSelfSigned serves with httptest's own certificate, which no
// root the proxy trusts has signed.
func tlsOriginWithSelfSigned(t *testing.T) *httptest.Server {
	s := httptest.NewTLSServer(originMux())
	t.Cleanup(s.Close)
	return s
}
