package httpfilter

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// allowOrigin makes origin.test resolve to loopback and allows its port.
func (h *harness) allowOrigin(name string, s interface{ Close() }, pt string) {
	h.res.set(name, "127.0.0.1")
	h.p.ports[uint16(mustAtoi(pt))] = true
}

func getJSON(t *testing.T, c *http.Client, req *http.Request) (*http.Response, echoReply, string) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var e echoReply
	json.Unmarshal(b, &e)
	return resp, e, string(b)
}

// TestDomainFronting: inside a tunnel to origin.test, a request naming
// another (even allowlisted) host is refused, over HTTP/1.1 and HTTP/2.
func TestDomainFronting(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test", "other.test"}})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	h.res.set("other.test", "127.0.0.1")
	for _, h2 := range []bool{false, true} {
		c := h.client(h2)
		for _, tt := range []struct {
			name, host string
			want       int
		}{
			{"same host", "origin.test:" + pt, 200},
			{"same host other case and dot", "ORIGIN.test.:" + pt, 200},
			{"other allowlisted host", "other.test:" + pt, 403},
			{"same host other port", "origin.test:8443", 403},
			{"literal of the same address", "127.0.0.1:" + pt, 403},
		} {
			t.Run(fmt.Sprintf("h2=%v/%s", h2, tt.name), func(t *testing.T) {
				req, _ := http.NewRequest("GET", "https://origin.test:"+pt+"/front", nil)
				req.Host = tt.host
				resp, e, body := getJSON(t, c, req)
				want := tt.want
				if h2 && want == 403 {
					want = http.StatusMisdirectedRequest // that stream alone
				}
				if resp.StatusCode != want {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, want, body)
				}
				if h2 && resp.ProtoMajor != 2 {
					t.Errorf("proto %s, want HTTP/2", resp.Proto)
				}
				if tt.want == 403 {
					checkRefusal(t, resp, body, want, ReasonDomainFronting, "origin.test")
					l := h.lastLog("reason", ReasonDomainFronting)
					if l == nil || l["connect"] != "origin.test:"+pt || !strings.Contains(fmt.Sprint(l["asked_host"]), strings.Split(tt.host, ":")[0]) {
						t.Errorf("log line %v does not name both hosts", l)
					}
				} else if e.Host != "origin.test:"+pt {
					t.Errorf("origin saw Host %q", e.Host)
				}
			})
		}
	}
}

// TestSNI: the ClientHello must name the CONNECT host, intercepted or not.
func TestSNI(t *testing.T) {
	for _, mode := range []struct {
		name string
		o    hopts
	}{{"mitm", hopts{}}, {"no-mitm", hopts{noMITM: true}}, {"exception", hopts{exceptions: []string{"origin.test"}}}} {
		mode.o.allow = []string{"origin.test", "other.test"}
		h := newHarness(t, mode.o)
		so := newHTTPSOrigin(t, originMux())
		pt := port(t, so)
		h.allowOrigin("origin.test", so, pt)
		roots := h.proxyCA
		if mode.name != "mitm" {
			roots = h.roots
		}
		for _, tt := range []struct {
			name, sni string
			ok        bool
			reason    string
		}{
			{"match", "origin.test", true, ""},
			{"mismatch", "other.test", false, ReasonSNIMismatch},
			{"missing", "", mode.name == "mitm", ReasonSNIMissing},
		} {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				c := h.connect(t, "origin.test:"+pt)
				defer c.Close()
				cfg := &tls.Config{RootCAs: roots, ServerName: tt.sni, NextProtos: []string{"http/1.1"}}
				if tt.sni == "" {
					cfg.InsecureSkipVerify = true // no name to verify; the point is what the proxy does
				}
				tc := tls.Client(c, cfg)
				tc.SetDeadline(time.Now().Add(5 * time.Second))
				err := tc.Handshake()
				if tt.ok {
					if err != nil {
						t.Fatalf("handshake: %v", err)
					}
					fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: origin.test:%s\r\nConnection: close\r\n\r\n", pt)
					resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
					if err != nil || resp.StatusCode != 200 {
						t.Fatalf("response %v, %v", resp, err)
					}
					return
				}
				if err == nil {
					t.Fatalf("handshake with SNI %q succeeded", tt.sni)
				}
				tc.Close()
				waitFor(t, func() bool { return h.lastLog("reason", tt.reason) != nil }, "log line with reason "+tt.reason)
			})
		}
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Errorf("10s waiting for %s", what)
}

// connect opens a CONNECT tunnel and returns the connection after the 200.
func (h *harness) connect(t testing.TB, authority string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", authority, resp, err)
	}
	if br.Buffered() > 0 {
		t.Fatalf("bytes after the CONNECT response")
	}
	return c
}

// TestExceptionTunnels: an exception is a byte tunnel, so the guest sees
// the origin's own certificate; interception presents the instance CA's.
func TestExceptionTunnels(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test", "mitm.test"}, exceptions: []string{"origin.test"}})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	h.allowOrigin("mitm.test", so, pt)
	for _, tt := range []struct {
		host   string
		wantCA string
		tunnel bool
	}{{"origin.test", "test origins", true}, {"mitm.test", "abox", false}} {
		t.Run(tt.host, func(t *testing.T) {
			c := h.connect(t, tt.host+":"+pt)
			defer c.Close()
			tc := tls.Client(c, &tls.Config{ServerName: tt.host, InsecureSkipVerify: true})
			if err := tc.Handshake(); err != nil {
				t.Fatal(err)
			}
			issuer := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName
			if !strings.Contains(issuer, tt.wantCA) {
				t.Errorf("issuer %q, want one containing %q", issuer, tt.wantCA)
			}
			fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n", tt.host, pt)
			resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("response %v %v", resp, err)
			}
		})
	}
}

// TestSmuggling sends each malformed shape on a raw socket, to the proxy
// and inside an intercepted tunnel.
func TestSmuggling(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	so := newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	host := "origin.test:" + port(t, o)
	big := strings.Repeat("a", 70<<10)
	shapes := []struct {
		name   string
		head   string // request line and headers, CRLF-terminated, without the final CRLF
		body   string
		status int
		reason string
		// tunnelReason, when set, is the reason inside a tunnel.
		tunnelReason string
	}{
		{"cl and te", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", 400, "content_length_with_transfer_encoding", ""},
		{"te and cl", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n", "0\r\n\r\n", 400, "content_length_with_transfer_encoding", ""},
		{"conflicting cl", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\nContent-Length: 5\r\n", "abcde", 400, "conflicting_content_length", ""},
		{"cl list", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nContent-Length: 4, 5\r\n", "abcd", 400, "invalid_content_length", ""},
		{"obs-fold", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-A: one\r\n two\r\n", "", 400, "obs_fold", ""},
		{"obs-fold tab", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-A: one\r\n\ttwo\r\n", "", 400, "obs_fold", ""},
		{"space before colon", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nTransfer-Encoding : chunked\r\n", "", 400, "invalid_header", ""},
		{"bare cr", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-A: a\rb\r\n", "", 400, "bare_cr", ""},
		{"te gzip", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n", 501, "unsupported_transfer_encoding", ""},
		{"double te", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", 501, "unsupported_transfer_encoding", ""},
		{"oversized headers", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\n" + strings.Repeat("X-Big: "+big[:15<<10]+"\r\n", 5), "", 431, "headers_too_large", ""},
		{"oversized field", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-Big: " + big[:20<<10] + "\r\n", "", 431, ReasonFieldTooLarge, ""},
		{"oversized request line", "GET http://HOST/" + big[:10<<10] + " HTTP/1.1\r\nHost: h\r\n", "", 414, ReasonURITooLong, ""},
		{"h2c upgrade", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n", "", 400, ReasonH2CUpgrade, ""},
		{"te in http/1.0", "POST http://HOST/ HTTP/1.0\r\nHost: h\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n", 400, "transfer_encoding_in_http10", ""},
		{"blocked upgrade then unguarded request", "GET http://blocked.test/ HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n", "", 403, "not_allowlisted", ReasonDomainFronting},
		{"unknown upgrade", "GET http://HOST/ HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: foo\r\n", "", 400, ReasonUpgradeRefused, ""},
		{"smuggled after valid", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloGET http://HOST/ HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n", "", 400, "obs_fold", ""},
		{"smuggled after chunked", "POST http://HOST/ HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET http://HOST/ HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 2\r\n", "", 400, "conflicting_content_length", ""},
	}
	for _, s := range shapes {
		for _, inTunnel := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/tunnel=%v", s.name, inTunnel), func(t *testing.T) {
				raw := strings.ReplaceAll(s.head, "HOST", host) + "\r\n" + s.body
				var c net.Conn
				if inTunnel {
					th := "origin.test:" + port(t, so)
					raw = strings.ReplaceAll(strings.ReplaceAll(s.head, "http://HOST/", "/"), "Host: h", "Host: "+th) + "\r\n" + s.body
					raw = strings.ReplaceAll(raw, "http://HOST/", "/")
					tc := tls.Client(h.connect(t, th), &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", NextProtos: []string{"http/1.1"}})
					if err := tc.Handshake(); err != nil {
						t.Fatal(err)
					}
					c = tc
				} else {
					var err error
					if c, err = net.Dial("tcp", h.addr); err != nil {
						t.Fatal(err)
					}
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.WriteString(c, raw)
				br := bufio.NewReader(c)
				var resp *http.Response
				var err error
				// Shapes with a valid first request get its 200 first.
				for {
					resp, err = http.ReadResponse(br, nil)
					if err != nil {
						t.Fatalf("reading response: %v", err)
					}
					io.Copy(io.Discard, resp.Body)
					if resp.StatusCode != 200 {
						break
					}
				}
				wantReason := s.reason
				if inTunnel && s.tunnelReason != "" {
					wantReason = s.tunnelReason
				}
				if resp.StatusCode != s.status || resp.Header.Get("X-Abox-Reason") != wantReason {
					t.Errorf("got %d %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), s.status, wantReason)
				}
				// The connection must be closed after a refusal.
				if _, err := http.ReadResponse(br, nil); err == nil {
					t.Errorf("connection still serves after a refusal")
				}
			})
		}
	}
	t.Run("refusals are logged and counted", func(t *testing.T) {
		for _, s := range shapes {
			if s.reason == ReasonH2CUpgrade || s.reason == ReasonUpgradeRefused || s.status == 403 {
				continue // decided by the handler, not the guard
			}
			if l := h.lastLog("reason", s.reason); l == nil || l["denial_id"] == nil {
				t.Errorf("%s: no log line with a denial id for %s", s.name, s.reason)
			} else if l["status"] != float64(s.status) {
				t.Errorf("%s: log line status %v, want %d", s.name, l["status"], s.status)
			}
		}
		if n := h.p.Stats().(Stats).BlockedByReason["obs_fold"]; n < 4 {
			t.Errorf("blocked_by_reason[obs_fold] = %d, want >= 4", n)
		}
	})
	t.Run("connect inside tunnel", func(t *testing.T) {
		th := "origin.test:" + port(t, so)
		for _, h2 := range []bool{false, true} {
			c := h.client(h2)
			req, _ := http.NewRequest("CONNECT", "https://"+th+"/", nil)
			req.Host = th
			resp, err := c.Transport.RoundTrip(req)
			if err != nil {
				t.Fatalf("h2=%v: %v", h2, err)
			}
			resp.Body.Close()
			if resp.StatusCode != 403 || resp.Header.Get("X-Abox-Reason") != ReasonConnectInTunnel {
				t.Errorf("h2=%v: got %d %q, want 403 %s", h2, resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonConnectInTunnel)
			}
		}
	})
}

// TestHopByHop: hop-by-hop headers, names listed in Connection and
// Proxy-Authorization never reach the origin, and the origin's never reach
// the guest.
func TestHopByHop(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	so := newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, u := range []string{"http://origin.test:" + port(t, o) + "/", "https://origin.test:" + port(t, so) + "/"} {
		t.Run(u[:5], func(t *testing.T) {
			req, _ := http.NewRequest("GET", u, nil)
			req.Header.Set("Connection", "X-Secret, keep-alive")
			req.Header.Set("X-Secret", "s")
			req.Header.Set("Keep-Alive", "timeout=5")
			req.Header.Set("Proxy-Authorization", "Basic Zm9vOmJhcg==")
			req.Header.Set("Proxy-Connection", "keep-alive")
			req.Header.Set("Te", "gzip")
			req.Header.Set("X-End-To-End", "kept")
			resp, e, body := getJSON(t, h.client(false), req)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			for _, k := range []string{"Connection", "X-Secret", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Te"} {
				if v := e.Header.Get(k); v != "" {
					t.Errorf("origin received %s: %q", k, v)
				}
			}
			if e.Header.Get("X-End-To-End") != "kept" {
				t.Errorf("end-to-end header lost: %v", e.Header)
			}
			// Over HTTP/2 (the HTTPS origin) Connection does not exist, so
			// the origin's X-Hop-Resp is an ordinary header there.
			if v := resp.Header.Get("X-Hop-Resp"); v != "" && strings.HasPrefix(u, "http:") {
				t.Errorf("guest received the origin's Connection-listed header: %q", v)
			}
		})
	}
}

func TestWebSocket(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
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
			c.Write(r.Context(), typ, append([]byte("echo:"), b...))
		}
	})
	o := newHTTPOrigin(t, mux)
	so := newHTTPSOrigin(t, mux)
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, u := range []string{"ws://origin.test:" + port(t, o) + "/ws", "wss://origin.test:" + port(t, so) + "/ws"} {
		t.Run(u[:3], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: h.client(false)})
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			for i := 0; i < 3; i++ {
				msg := fmt.Sprintf("m%d", i)
				if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					t.Fatal(err)
				}
				_, b, err := c.Read(ctx)
				if err != nil || string(b) != "echo:"+msg {
					t.Fatalf("read %q %v, want echo:%s", b, err, msg)
				}
			}
			c.Close(websocket.StatusNormalClosure, "")
		})
	}
}

// TestSSE: each event reaches the guest before the origin writes the next.
func TestSSE(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	next := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/events", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(5 * time.Second):
				return // the guest never saw the event: it was buffered
			}
		}
	})
	o := newHTTPOrigin(t, mux)
	so := newHTTPSOrigin(t, mux)
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, tc := range []struct {
		name, url string
		h2        bool
	}{{"http", "http://origin.test:" + port(t, o) + "/events", false}, {"https h1", "https://origin.test:" + port(t, so) + "/events", false}, {"https h2", "https://origin.test:" + port(t, so) + "/events", true}} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := h.client(tc.h2).Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for i := 0; i < 3; i++ {
				done := make(chan string, 1)
				go func() {
					l, _ := br.ReadString('\n')
					br.ReadString('\n')
					done <- l
				}()
				select {
				case l := <-done:
					if l != fmt.Sprintf("data: %d\n", i) {
						t.Fatalf("event %d: %q", i, l)
					}
				case <-time.After(3 * time.Second):
					t.Fatalf("event %d not delivered while the origin waits", i)
				}
				next <- struct{}{}
			}
		})
	}
}

// TestKeyLog: with the key log on, the proxy writes an NSS line for the
// intercepted session whose client random is the guest's; off, nothing.
func TestKeyLog(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	session := func(t *testing.T) (clientRandom string) {
		var own bytes.Buffer
		c := h.connect(t, "origin.test:"+pt)
		defer c.Close()
		tc := tls.Client(c, &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", KeyLogWriter: &own, MaxVersion: tls.VersionTLS12})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(own.String())
		if len(f) < 3 || f[0] != "CLIENT_RANDOM" {
			t.Fatalf("client's own key log %q", own.String())
		}
		return f[1]
	}
	if h.p.KeyLogEnabled() {
		t.Fatal("key log on by default")
	}
	session(t)
	if _, err := os.Stat(h.keyLog); err == nil {
		t.Error("key log file written while off")
	}
	if err := h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	cr := session(t)
	// TLS 1.3 writes CLIENT_TRAFFIC_SECRET_0 lines instead.
	c := h.connect(t, "origin.test:"+pt)
	var own13 bytes.Buffer
	tc := tls.Client(c, &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test", KeyLogWriter: &own13})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := h.p.SetKeyLog(false); err != nil {
		t.Fatal(err)
	}
	crOff := session(t)
	b, err := os.ReadFile(h.keyLog)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(h.keyLog)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key log mode %v, want 0600", st.Mode().Perm())
	}
	if !strings.Contains(string(b), "CLIENT_RANDOM "+cr+" ") {
		t.Errorf("key log lacks CLIENT_RANDOM for the session %s:\n%s", cr, b)
	}
	cr13 := strings.Fields(own13.String())[1]
	if !strings.Contains(string(b), "CLIENT_TRAFFIC_SECRET_0 "+cr13+" ") {
		t.Errorf("key log lacks the TLS 1.3 traffic secret for %s", cr13)
	}
	if strings.Contains(string(b), crOff) {
		t.Errorf("key log has a session from after it was switched off")
	}
	if _, err := hex.DecodeString(cr); err != nil || len(cr) != 64 {
		t.Errorf("client random %q is not 32 hex bytes", cr)
	}
}

// TestConnectionCap: connections over the cap get a 503 at once, and the
// refusal has its decision line.
func TestConnectionCap(t *testing.T) {
	h := newHarness(t, hopts{maxConns: 2})
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	waitFor(t, func() bool { return h.p.stats.connsOpen.Load() == 2 }, "two open connections")
	resp, body := h.rawRequest(t, "GET http://healthcheck.abox.local/ HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 503 || resp.Header.Get("X-Abox-Reason") != ReasonTooManyConns {
		t.Errorf("over the cap: %d %q %q, want 503 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body, ReasonTooManyConns)
	}
	held[0].Close()
	waitFor(t, func() bool { return h.p.stats.connsOpen.Load() == 1 }, "a freed slot")
	resp, _ = h.rawRequest(t, "GET http://healthcheck.abox.local/ HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Errorf("under the cap: %d, want 200", resp.StatusCode)
	}
	held[1].Close()
	if st := h.p.Stats().(Stats); st.ConnsRefused != 1 {
		t.Errorf("connections_refused = %d, want 1", st.ConnsRefused)
	}
	waitFor(t, func() bool { return h.lastLog("reason", ReasonTooManyConns) != nil }, "a decision line for the refused connection")
	if l := h.lastLog("reason", ReasonTooManyConns); l["verdict"] != "block" || fmt.Sprint(l["status"]) != "503" {
		t.Errorf("decision line of the refused connection: %v", l)
	}
}

// TestLogLine: one JSON line per request with the documented fields; the
// query never appears.
func TestLogLine(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	resp, _ := h.rawRequest(t, "POST http://origin.test:"+port(t, o)+"/p/a?token=SECRET HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	h.rawRequest(t, "GET http://blocked.test/x?token=SECRET HTTP/1.1\r\nHost: h\r\n\r\n")
	waitFor(t, func() bool { return len(h.log.lines()) == 2 }, "two log lines")
	ls := h.log.lines()
	if len(ls) != 2 {
		t.Fatalf("%d log lines, want 2", len(ls))
	}
	for _, k := range []string{"time", "client", "method", "host", "port", "path", "status", "bytes_up", "bytes_down", "duration_ms", "verdict", "reason"} {
		if _, ok := ls[0][k]; !ok {
			t.Errorf("log line lacks %q: %v", k, ls[0])
		}
	}
	if ls[0]["path"] != "/p/a" || ls[0]["bytes_up"] != float64(3) || ls[0]["verdict"] != "allow" {
		t.Errorf("allowed line %v", ls[0])
	}
	if ls[1]["verdict"] != "block" || ls[1]["denial_id"] == nil || ls[1]["reason"] != "not_allowlisted" {
		t.Errorf("blocked line %v", ls[1])
	}
	if strings.Contains(h.log.b.String(), "SECRET") {
		t.Errorf("the query reached the log")
	}
	st := h.p.Stats().(Stats)
	if st.Requests != 2 || st.Allowed != 1 || st.BlockedByReason["not_allowlisted"] != 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestPlainHTTPInsideConnect: bytes that are not TLS in a CONNECT tunnel
// are served as HTTP under the same rules (Host must match, decided again).
func TestPlainHTTPInsideConnect(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test", "other.test"}})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.allowOrigin("origin.test", o, pt)
	h.res.set("other.test", "127.0.0.1")
	tests := []struct {
		name, connect, host string
		want                int
		reason              string
	}{
		{"origin", "origin.test:" + pt, "origin.test:" + pt, 200, ""},
		{"fronting", "origin.test:" + pt, "other.test:" + pt, 403, ReasonDomainFronting},
		{"healthcheck", "healthcheck.abox.local:80", "healthcheck.abox.local", 200, "healthcheck"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := h.connect(t, tt.connect)
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "GET /inside HTTP/1.1\r\nHost: %s\r\n\r\n", tt.host)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want || resp.Header.Get("X-Abox-Reason") != tt.reason {
				t.Errorf("got %d %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), tt.want, tt.reason)
			}
		})
	}
}

// TestUpstreamTimeout: an origin that never answers is a 504 with a reason.
func TestUpstreamTimeout(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"slow.test"}, respHeader: 300 * time.Millisecond})
	release := make(chan struct{})
	defer close(release)
	o := newHTTPOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	h.allowOrigin("slow.test", o, port(t, o))
	resp, body := h.rawRequest(t, "GET http://slow.test:"+port(t, o)+"/ HTTP/1.1\r\nHost: slow.test\r\n\r\n")
	checkRefusal(t, resp, body, 504, ReasonUpstreamTimeout, "slow.test")
	if strings.Contains(body, "timeout awaiting") {
		t.Errorf("body leaks the transport error: %q", body)
	}
}
