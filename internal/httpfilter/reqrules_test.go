package httpfilter

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
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// ruleLines are the request rules of origin.test in the tests below.
var ruleLines = []string{
	"origin.test GET,HEAD /repos/acme/**",
	"origin.test POST /repos/acme/app/pulls",
	"origin.test GET /search?q=x",
	"origin.test GET /ws",
	"origin.test GET /stream",
	"origin.test PUT /trial/** audit",
}

// ruleCase is one request to origin.test and what must come of it: the
// status, the reason (empty when allowed) and, when allowed, the exact
// request-target the origin receives.
type ruleCase struct {
	name, method, target string
	status               int
	reason               string
	origin               string // request-target the origin must read
	wouldDeny            string
}

var ruleCases = []ruleCase{
	{"allowed read", "GET", "/repos/acme/app", 200, "", "/repos/acme/app", ""},
	{"allowed head", "HEAD", "/repos/acme/app/issues", 200, "", "/repos/acme/app/issues", ""},
	{"allowed post", "POST", "/repos/acme/app/pulls", 200, "", "/repos/acme/app/pulls", ""},
	{"method no rule names", "DELETE", "/repos/acme/app", 403, reqrules.ReasonMethodNotAllowed, "", ""},
	{"post elsewhere", "POST", "/repos/acme/app/issues", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"other owner", "GET", "/repos/other/x", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"dot segments out of the rule", "GET", "/repos/acme/app/../../other/x", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"encoded slash then dots", "GET", "/repos/acme%2fapp/../other", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"encoded dots", "GET", "/repos/acme/%2e%2e/other/x", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"encoded dots upper", "GET", "/repos/acme/%2E%2E/%2E%2E/repos/other", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"dots inside the rule canonicalised", "GET", "/repos/acme/x/../app", 200, "", "/repos/acme/app", ""},
	{"dots at the root", "GET", "/%2e%2e/repos/acme/app", 200, "", "/repos/acme/app", ""},
	{"duplicate slashes", "GET", "/repos//acme/.//app//", 200, "", "/repos/acme/app/", ""},
	{"encoded unreserved", "GET", "/repos/%61cme/%61pp", 200, "", "/repos/acme/app", ""},
	{"encoded slash kept in its segment", "GET", "/repos/acme/a%2fb", 200, "", "/repos/acme/a%2Fb", ""},
	{"parameter to a dot segment", "GET", "/repos/acme/app/..;/..;/other", 403, reqrules.ReasonPathNotCanonical, "", ""},
	{"parameter kept", "GET", "/repos/acme/app;v=1", 200, "", "/repos/acme/app;v=1", ""},
	{"backslash", "GET", "/repos/acme/app%5c..%5cother", 403, reqrules.ReasonPathNotCanonical, "", ""},
	{"double encoding", "GET", "/repos/acme/%252e%252e/x", 403, reqrules.ReasonPathNotCanonical, "", ""},
	{"query rule", "GET", "/search?q=x", 200, "", "/search?q=x", ""},
	{"query canonicalised", "GET", "/search?%71=%78", 200, "", "/search?q=x", ""},
	{"query rule refuses others", "GET", "/search?q=y", 403, reqrules.ReasonPathNotAllowed, "", ""},
	// A host whose rules look at a query has every query canonicalised.
	{"query canonicalised beside a query rule", "GET", "/repos/acme/app?%71=1&a=%7e", 200, "", "/repos/acme/app?q=1&a=~", ""},
	{"audit rule allows", "PUT", "/trial/f", 200, "", "/trial/f", reqrules.ReasonMethodNotAllowed},
	{"audit rule elsewhere", "PUT", "/other", 403, reqrules.ReasonPathNotAllowed, "", ""},
	{"lower-case method is another method", "get", "/repos/acme/app", 403, reqrules.ReasonMethodNotAllowed, "", ""},
}

// targetOrigin records the request-target of every request it reads, as
// it read it (net/http keeps it in RequestURI, HTTP/2's :path included).
type targetOrigin struct {
	mu  sync.Mutex
	got []string
}

func (o *targetOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.got = append(o.got, r.RequestURI)
	o.mu.Unlock()
	io.Copy(io.Discard, r.Body)
	w.Write([]byte("ok"))
}

func (o *targetOrigin) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	g := o.got
	o.got = nil
	return g
}

// checkRuleCase checks the answer to c and what the origin received.
func (h *harness) checkRuleCase(t *testing.T, c ruleCase, o *targetOrigin, status int, hdr http.Header, body string) {
	t.Helper()
	got := o.take()
	if status != c.status {
		t.Fatalf("%s %s: status %d, want %d (body %q)", c.method, c.target, status, c.status, body)
	}
	if c.status != 200 {
		if len(got) != 0 {
			t.Errorf("%s %s refused, but the origin read %q", c.method, c.target, got)
		}
		if r := hdr.Get("X-Abox-Reason"); r != c.reason {
			t.Errorf("X-Abox-Reason %q, want %q", r, c.reason)
		}
		id := hdr.Get("X-Abox-Denial-Id")
		if id == "" || hdr.Get("X-Abox-Rule-Set") != "origin.test" {
			t.Errorf("denial id %q, rule set %q: want an id and origin.test", id, hdr.Get("X-Abox-Rule-Set"))
		}
		if body != "" && (!strings.Contains(body, c.reason) || !strings.Contains(body, "rules of origin.test") || !strings.Contains(body, id)) {
			t.Errorf("body %q does not name the reason %s, the rule set and the denial id %s", body, c.reason, id)
		}
		line := h.waitLine(t, "denial_id", id)
		if line["reason"] != c.reason || line["rule_set"] != "origin.test" || line["rule"] != "origin.test" {
			t.Errorf("log line %v: want reason %s, rule and rule_set origin.test", line, c.reason)
		}
		return
	}
	if len(got) != 1 || got[0] != c.origin {
		t.Errorf("%s %s: origin read %q, want exactly %q", c.method, c.target, got, c.origin)
	}
	if c.wouldDeny != "" {
		line := h.waitLine(t, "would_deny", c.wouldDeny)
		if line["verdict"] != "allow" || line["request_rule"] != "PUT /trial/** audit" {
			t.Errorf("audit line %v: want allow by PUT /trial/** audit", line)
		}
	}
}

// waitLine waits for the decision line whose k is v (a line is written
// once the exchange ends, after the guest has its answer).
func (h *harness) waitLine(t *testing.T, k, v string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if l := h.lastLog(k, v); l != nil {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no decision line with %s=%s in %s", k, v, h.log.String())
	return nil
}

func newRulesHarness(t *testing.T, o hopts) *harness {
	t.Helper()
	o.allow = append(append([]string(nil), ruleLines...), o.allow...)
	return newHarness(t, o)
}

// TestRulesPlainHTTP: absolute-form plain requests are decided by the
// host's rules on the bytes sent, and the origin reads the decided form.
func TestRulesPlainHTTP(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	o := &targetOrigin{}
	srv := newHTTPOrigin(t, o)
	pt := port(t, srv)
	h.allowOrigin("origin.test", srv, pt)
	for _, c := range ruleCases {
		t.Run(c.name, func(t *testing.T) {
			c2, err := net.Dial("tcp", h.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			c2.SetDeadline(time.Now().Add(10 * time.Second))
			fmt.Fprintf(c2, "%s http://origin.test:%s%s HTTP/1.1\r\nHost: origin.test:%s\r\nContent-Length: 0\r\n\r\n", c.method, pt, c.target, pt)
			resp, err := http.ReadResponse(bufio.NewReader(c2), &http.Request{Method: c.method})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			h.checkRuleCase(t, c, o, resp.StatusCode, resp.Header, string(b))
		})
	}
}

// TestRulesInterceptedH1: every request of one keep-alive connection
// inside an intercepted tunnel is decided on its own: the whole table goes
// over one connection, twice, refusals included (a policy refusal leaves
// an HTTP/1.1 connection open), so a request allowed after a refused one,
// and a refused one after an allowed one, are decided alike.
func TestRulesInterceptedH1(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	o := &targetOrigin{}
	srv := newHTTPSOrigin(t, o)
	pt := port(t, srv)
	h.allowOrigin("origin.test", srv, pt)
	tc := tls.Client(h.connect(t, "origin.test:"+pt), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	br := bufio.NewReader(tc)
	for round := range 2 {
		for _, c := range ruleCases {
			t.Run(fmt.Sprintf("%d %s", round, c.name), func(t *testing.T) {
				tc.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(tc, "%s %s HTTP/1.1\r\nHost: origin.test:%s\r\nContent-Length: 0\r\n\r\n", c.method, c.target, pt)
				resp, err := http.ReadResponse(br, &http.Request{Method: c.method})
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				h.checkRuleCase(t, c, o, resp.StatusCode, resp.Header, string(b))
			})
		}
	}
	if n := h.p.stats.intercepted.Load(); n != 1 {
		t.Errorf("%d intercepted tunnels, want one connection for every request", n)
	}
}

// h2Raw sends requests on one HTTP/2 connection through the proxy with
// the :path given byte for byte (a URL's Opaque goes out as it is).
func (h *harness) h2Raw(t *testing.T, authority string) *http2.ClientConn {
	t.Helper()
	tc := tls.Client(h.connect(t, authority), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"h2"}})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	cc, err := (&http2.Transport{}).NewClientConn(tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func rawPathRequest(method, authority, target string) *http.Request {
	return &http.Request{Method: method, URL: &url.URL{Scheme: "https", Host: authority, Opaque: target},
		Host: authority, Header: http.Header{}, Proto: "HTTP/2.0", ProtoMajor: 2}
}

// TestRulesInterceptedH2: every stream is decided alone; a refused stream
// is answered 403 while a stream beside it on the same connection streams
// on, and later streams on that connection are decided as the first.
func TestRulesInterceptedH2(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	o := &targetOrigin{}
	mux := streamMux()
	mux.Handle("/", o)
	srv := newHTTPSOrigin(t, mux)
	pt := port(t, srv)
	h.allowOrigin("origin.test", srv, pt)
	auth := "origin.test:" + pt
	cc := h.h2Raw(t, auth)
	// A stream the rules allow, kept open beside the others.
	sresp, err := cc.RoundTrip(rawPathRequest("GET", auth, "/stream"))
	if err != nil || sresp.StatusCode != 200 {
		t.Fatalf("stream: %v %v", sresp, err)
	}
	defer sresp.Body.Close()
	reads := make(chan error, 100)
	go func() {
		buf := make([]byte, 64)
		for {
			_, err := sresp.Body.Read(buf)
			reads <- err
			if err != nil {
				return
			}
		}
	}()
	for _, c := range ruleCases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := cc.RoundTrip(rawPathRequest(c.method, auth, c.target))
			if err != nil {
				t.Fatalf("%s %s: %v", c.method, c.target, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			h.checkRuleCase(t, c, o, resp.StatusCode, resp.Header, string(b))
			if err := <-reads; err != nil {
				t.Fatalf("the stream beside %s %s ended: %v", c.method, c.target, err)
			}
		})
	}
	for len(reads) > 0 {
		if err := <-reads; err != nil {
			t.Fatalf("the stream ended: %v", err)
		}
	}
	if err := <-reads; err != nil {
		t.Fatalf("the stream ended after the refusals: %v", err)
	}
	if n := h.p.stats.intercepted.Load(); n != 1 {
		t.Errorf("%d intercepted tunnels, want every stream on the first one", n)
	}
}

// TestRulesWebSocket: the upgrade request is the request: a path the
// rules allow opens the socket (in the form decided), another is refused
// before the origin. Raw requests: a WebSocket client cleans dot segments
// itself.
func TestRulesWebSocket(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	var mu sync.Mutex
	var got []string
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.RequestURI)
		mu.Unlock()
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		typ, b, err := c.Read(r.Context())
		if err == nil {
			c.Write(r.Context(), typ, b)
		}
	})
	o := newHTTPOrigin(t, mux)
	so := newHTTPSOrigin(t, mux)
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, tls_ := range []bool{false, true} {
		for _, tt := range []struct {
			path, origin string
			status       int
		}{
			{"/ws", "/ws", 101},
			{"/x/%2e%2e/ws", "/ws", 101},
			{"//ws", "/ws", 101},
			{"/wss", "", 403},
			{"/ws/%2e%2e/repos/other", "", 403},
		} {
			t.Run(fmt.Sprintf("tls=%v%s", tls_, tt.path), func(t *testing.T) {
				mu.Lock()
				got = nil
				mu.Unlock()
				var c net.Conn
				target := "http://origin.test:" + port(t, o) + tt.path
				auth := "origin.test:" + port(t, o)
				if tls_ {
					auth = "origin.test:" + port(t, so)
					tc := tls.Client(h.connect(t, auth), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
					c, target = tc, tt.path
				} else {
					var err error
					if c, err = net.Dial("tcp", h.addr); err != nil {
						t.Fatal(err)
					}
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
					"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", target, auth)
				resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode != tt.status {
					t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
				}
				if tt.status == 403 && resp.Header.Get("X-Abox-Reason") != reqrules.ReasonPathNotAllowed {
					t.Errorf("reason %q, want %s", resp.Header.Get("X-Abox-Reason"), reqrules.ReasonPathNotAllowed)
				}
				mu.Lock()
				defer mu.Unlock()
				if tt.status == 101 && (len(got) != 1 || got[0] != tt.origin) {
					t.Errorf("origin read %q, want %q", got, tt.origin)
				}
				if tt.status != 101 && len(got) != 0 {
					t.Errorf("refused upgrade reached the origin: %q", got)
				}
			})
		}
	}
}

// TestRulesPassiveAudits: in passive and learn mode a rule refusal is
// allowed and logged would_deny, as those modes do for names; active mode
// refuses it.
func TestRulesPassiveAudits(t *testing.T) {
	for _, m := range []policy.Mode{policy.Passive, policy.Learn, policy.Active} {
		t.Run(string(m), func(t *testing.T) {
			h := newRulesHarness(t, hopts{})
			h.engine.SetMode(m)
			o := &targetOrigin{}
			srv := newHTTPOrigin(t, o)
			pt := port(t, srv)
			h.allowOrigin("origin.test", srv, pt)
			resp, body := h.rawRequest(t, "DELETE http://origin.test:"+pt+"/repos/acme/app HTTP/1.1\r\nHost: origin.test\r\n\r\n")
			if m == policy.Active {
				if resp.StatusCode != 403 || len(o.take()) != 0 {
					t.Fatalf("active DELETE: %d %q, want 403 before the origin", resp.StatusCode, body)
				}
				return
			}
			if resp.StatusCode != 200 {
				t.Fatalf("%s DELETE: %d %q", m, resp.StatusCode, body)
			}
			l := h.waitLine(t, "would_deny", reqrules.ReasonMethodNotAllowed)
			if l["verdict"] != "allow" || l["rule_set"] != "origin.test" {
				t.Errorf("line %v", l)
			}
			if got := o.take(); len(got) != 1 || got[0] != "/repos/acme/app" {
				t.Errorf("origin read %q", got)
			}
		})
	}
}

// TestRulesOnTunnelRefused: an entry with rules on a host the proxy
// tunnels cannot be enforced: New refuses the list, the engine given the
// proxy's check refuses to load it and keeps the old one on reload and on
// an edit, and a CONNECT to a host with rules is intercepted even when a
// list in force says otherwise.
func TestRulesOnTunnelRefused(t *testing.T) {
	for _, tt := range []struct {
		name       string
		noMITM     bool
		exceptions []string
		lines      string
		want       string // "" when the list is fine
	}{
		{"no-mitm", true, nil, "origin.test GET /**\n", "origin.test has rules, but interception is off"},
		{"exception", false, []string{"origin.test"}, "origin.test GET /**\n", "origin.test is a MITM exception"},
		{"exception under a wildcard with rules", false, []string{"a.origin.test"}, "*.origin.test GET /**\n", "*.origin.test has rules, but a.origin.test is a MITM exception"},
		{"exception on a host without rules", false, []string{"other.test"}, "other.test\norigin.test GET /**\n", ""},
		{"no-mitm without rules", true, nil, "origin.test\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tun, err := NewTunnelled(tt.noMITM, tt.exceptions)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			path := filepath.Join(dir, "allowlist.txt")
			os.WriteFile(path, []byte(tt.lines), 0o644)
			_, err = policy.New(policy.Config{AllowlistPath: path, Check: tun.Check})
			if tt.want == "" {
				if err != nil {
					t.Fatalf("load: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrRulesOnTunnel) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "drop the rules") {
				t.Fatalf("load: %v, want an error saying %q and the fix", err, tt.want)
			}
			// On reload: the old list stays, the error is in the status.
			os.WriteFile(path, []byte("other.test\n"), 0o644)
			eng, err := policy.New(policy.Config{AllowlistPath: path, Check: tun.Check})
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(path, []byte(tt.lines), 0o644)
			if err := eng.Reload(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("reload: %v, want %q", err, tt.want)
			}
			if st := eng.Status(); !strings.Contains(st.LastError, tt.want) || eng.List().Len() != 1 {
				t.Errorf("after the rejected reload: status %+v, list %q", st, eng.List().Text())
			}
			// An edit through the engine is refused alike.
			os.WriteFile(path, []byte("other.test\n"), 0o644)
			text, _ := eng.Text()
			if err := eng.Replace(text, []byte(tt.lines)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("edit: %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("New refuses", func(t *testing.T) {
		dir := t.TempDir()
		path := filepath.Join(dir, "allowlist.txt")
		os.WriteFile(path, []byte("origin.test GET /**\n"), 0o644)
		eng, err := policy.New(policy.Config{AllowlistPath: path})
		if err != nil {
			t.Fatal(err)
		}
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		defer ln.Close()
		h := newHarness(t, hopts{})
		_, err = New(Config{Listener: ln, Policy: eng, CA: h.p.cfg.CA, MITMExceptions: []string{"origin.test"}})
		if !errors.Is(err, ErrRulesOnTunnel) {
			t.Fatalf("New: %v, want %v", err, ErrRulesOnTunnel)
		}
	})
	t.Run("CONNECT intercepted", func(t *testing.T) {
		// The engine has no check here: a list with rules on an
		// exception is in force, and the proxy intercepts anyway.
		h := newRulesHarness(t, hopts{})
		o := &targetOrigin{}
		srv := newHTTPSOrigin(t, o)
		pt := port(t, srv)
		h.allowOrigin("origin.test", srv, pt)
		h.p.tunnelled.Hosts["origin.test"] = true
		tc := tls.Client(h.connect(t, "origin.test:"+pt), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
		defer tc.Close()
		if err := tc.Handshake(); err != nil {
			t.Fatalf("handshake with the proxy's CA: %v (tunnelled?)", err)
		}
		fmt.Fprintf(tc, "DELETE /repos/acme/app HTTP/1.1\r\nHost: origin.test:%s\r\n\r\n", pt)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil || resp.StatusCode != 403 {
			t.Fatalf("DELETE in the tunnel: %v %v", resp, err)
		}
		if got := o.take(); len(got) != 0 {
			t.Errorf("origin read %q", got)
		}
	})
}

// TestRulesDecideOneList: the name decision and the rule set come from
// one list, so an entry's rules are never paired with another list's.
func TestRulesDecideOneList(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	ad, rules, _, _ := h.p.decideName("origin.test")
	if ad.Verdict != allowlist.Allow || rules == nil || rules.Name() != "origin.test" {
		t.Fatalf("decideName: %v %v", ad, rules)
	}
}

// TestRulesChangeAppliesToTheNextRequest: a reload that narrows the rules
// decides the next request of a connection opened before it, HTTP/1.1
// keep-alive and HTTP/2 alike.
func TestRulesChangeAppliesToTheNextRequest(t *testing.T) {
	h := newRulesHarness(t, hopts{})
	o := &targetOrigin{}
	srv := newHTTPSOrigin(t, o)
	pt := port(t, srv)
	h.allowOrigin("origin.test", srv, pt)
	auth := "origin.test:" + pt
	cc := h.h2Raw(t, auth)
	tc := tls.Client(h.connect(t, auth), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	br := bufio.NewReader(tc)
	statuses := func() (h1, h2 int) {
		t.Helper()
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(tc, "GET /repos/acme/app HTTP/1.1\r\nHost: %s\r\n\r\n", auth)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r2, err := cc.RoundTrip(rawPathRequest("GET", auth, "/repos/acme/app"))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r2.Body)
		r2.Body.Close()
		return resp.StatusCode, r2.StatusCode
	}
	if a, b := statuses(); a != 200 || b != 200 {
		t.Fatalf("before the change: %d %d, want 200 200", a, b)
	}
	if err := os.WriteFile(h.engine.Path(), []byte("origin.test GET /repos/acme/other/**\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.engine.Reload(); err != nil {
		t.Fatal(err)
	}
	if a, b := statuses(); a != 403 || b != 403 {
		t.Fatalf("after the change: %d %d, want 403 403", a, b)
	}
}

// TestRulesRevokeUpgrades: a WebSocket opened under rules that allowed its
// upgrade is closed, plain and inside an intercepted tunnel, once rules
// in force refuse that upgrade request; a change that still allows it
// leaves it open.
func TestRulesRevokeUpgrades(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			c.Write(r.Context(), typ, b)
		}
	})
	for _, tls_ := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls_), func(t *testing.T) {
			h := newRulesHarness(t, hopts{})
			o := newHTTPOrigin(t, mux)
			so := newHTTPSOrigin(t, mux)
			h.allowOrigin("origin.test", o, port(t, o))
			h.p.ports[uint16(mustAtoi(port(t, so)))] = true
			open := func() (net.Conn, *bufio.Reader) {
				var c net.Conn
				auth, target := "origin.test:"+port(t, o), "http://origin.test:"+port(t, o)+"/ws"
				if tls_ {
					auth, target = "origin.test:"+port(t, so), "/ws"
					c = tls.Client(h.connect(t, auth), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
				} else {
					var err error
					if c, err = net.Dial("tcp", h.addr); err != nil {
						t.Fatal(err)
					}
				}
				t.Cleanup(func() { c.Close() })
				fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
					"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", target, auth)
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, &http.Request{Method: "GET"})
				if err != nil || resp.StatusCode != 101 {
					t.Fatalf("upgrade: %v %v", resp, err)
				}
				return c, br
			}
			// alive sends a masked ping frame and reports whether the
			// connection still answers (the origin's pong) or was closed.
			alive := func(c net.Conn, br *bufio.Reader) bool {
				c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := c.Write([]byte{0x89, 0x80, 1, 2, 3, 4}); err != nil {
					return false
				}
				var pong [2]byte // 0x8A, no payload
				_, err := io.ReadFull(br, pong[:])
				return err == nil
			}
			reload := func(lines ...string) {
				if err := os.WriteFile(h.engine.Path(), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := h.engine.Reload(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * policyPoll) // the watch's pass
			}
			c, br := open()
			if !alive(c, br) {
				t.Fatal("the WebSocket does not answer")
			}
			reload("origin.test GET /ws", "origin.test GET /other")
			if !alive(c, br) {
				t.Fatal("a change that still allows the upgrade closed it")
			}
			reload("origin.test GET /other")
			if alive(c, br) {
				t.Fatal("the WebSocket outlived the rules that allowed it")
			}
		})
	}
}
