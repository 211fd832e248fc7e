package httpfilter

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestInnerRequestTarget: inside a tunnel, a request-target is origin
// form, "*" for OPTIONS, or absolute form naming the tunnel's authority;
// any other shape is 400 invalid_target and reaches no origin. The origin
// is a shared front end with two virtual hosts on one address that routes
// as RFC 9112 3.2.2 says (the target's authority over the Host field, as
// Go's server does): "GET http:https://evil.test/" with the tunnel's Host
// reached evil.test there before the fix. Intercepted TLS, plain HTTP in a
// tunnel to port 80, and WebSocket upgrades, over HTTP/1.1.
func TestInnerRequestTarget(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test", "plain.test"}})
	vhosts := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		json.NewEncoder(w).Encode(map[string]string{"vhost": strings.Split(r.Host, ":")[0], "uri": r.RequestURI})
	})
	so := newHTTPSOrigin(t, vhosts)
	po := newHTTPOrigin(t, vhosts)
	spt, ppt := port(t, so), port(t, po)
	h.allowOrigin("origin.test", so, spt)
	h.allowOrigin("plain.test", po, ppt)
	modes := []struct {
		name, authority, host string
		tls                   bool
	}{
		{"tls", "origin.test:" + spt, "origin.test", true},
		{"plain", "plain.test:" + ppt, "plain.test", false},
	}
	const upgrade = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for _, m := range modes {
		scheme := map[bool]string{true: "https", false: "http"}[m.tls]
		for _, tt := range []struct {
			name, line, extra, body string
			wantURI                 string // "" for a refusal
			reason                  string // of the refusal, if not invalid_target
		}{
			{"origin form", "GET /p?q=1", "", "", "/p?q=1", ""},
			{"absolute form of the tunnel's authority", "GET " + scheme + "://" + m.authority + "/p", "", "", "/p", ""},
			{"options star", "OPTIONS *", "", "", "*", ""},
			{"opaque naming another host", "GET http:https://evil.test/", "", "", "", ""},
			{"opaque post", "POST http:http://evil.test/x", "Content-Length: 2\r\n", "hi", "", ""},
			{"opaque naming the same host", "GET https:" + m.authority + "/", "", "", "", ""},
			{"opaque websocket", "GET http:https://evil.test/", upgrade, "", "", ""},
			{"opaque mailto", "GET mailto:a@evil.test", "", "", "", ""},
			{"relative path", "GET evil.test/", "", "", "", "malformed_request"}, // http.ReadRequest's own refusal
			{"star for get", "GET *", "", "", "", ""},
			{"user information", "GET " + scheme + "://u@" + m.authority + "/", "", "", "", ""},
			{"other scheme", "GET ftp://" + m.authority + "/", "", "", "", ""},
		} {
			t.Run(m.name+"/"+tt.name, func(t *testing.T) {
				c := h.connect(t, m.authority)
				defer c.Close()
				if m.tls {
					tc := tls.Client(c, &tls.Config{RootCAs: h.proxyCA, ServerName: m.host, NextProtos: []string{"http/1.1"}})
					if err := tc.Handshake(); err != nil {
						t.Fatal(err)
					}
					c = tc
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				fmt.Fprintf(c, "%s HTTP/1.1\r\nHost: %s\r\n%s\r\n%s", tt.line, m.authority, tt.extra, tt.body)
				br := bufio.NewReader(c)
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if tt.reason != "" {
					if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Abox-Reason") != tt.reason {
						t.Errorf("status %d reason %q, want 400 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), tt.reason)
					}
					return
				}
				if tt.wantURI == "" {
					checkRefusal(t, resp, string(b), http.StatusBadRequest, ReasonInvalidTarget, "")
					if _, err := br.ReadByte(); err == nil {
						t.Errorf("the connection stayed open after the refusal")
					}
					target := strings.Fields(tt.line)[1]
					waitFor(t, func() bool { return h.lastLog("reason", ReasonInvalidTarget) != nil }, "the refusal's decision line")
					if l := h.lastLog("reason", ReasonInvalidTarget); l["connect"] != m.authority || (strings.Contains(target, ":") && l["path"] == "") {
						t.Errorf("decision line %v: want the tunnel's authority and a path naming %q", l, target)
					}
					return
				}
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				if tt.wantURI == "*" {
					return // Go's server answers OPTIONS * itself
				}
				var got map[string]string
				if err := json.Unmarshal(b, &got); err != nil {
					t.Fatalf("origin reply %q: %v", b, err)
				}
				if got["vhost"] != m.host || got["uri"] != tt.wantURI {
					t.Errorf("origin served vhost %q for %q, want %q for %q", got["vhost"], got["uri"], m.host, tt.wantURI)
				}
			})
		}
	}
}

// TestHostDecodedOnce: the authority of a request is percent-decoded once.
// net/url turns "origin%252etest" into "origin%2etest" and the proxy
// decoded that again into origin.test, accepting a double encoding that
// docs/http.md says is refused: in absolute form, in a CONNECT, and in an
// absolute-form request inside a tunnel.
func TestHostDecodedOnce(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.allowOrigin("origin.test", o, pt)
	send := func(t *testing.T, c net.Conn, raw string) *http.Response {
		t.Helper()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	for _, tt := range []struct{ name, raw string }{
		{"absolute form", "GET http://origin%252etest:" + pt + "/ HTTP/1.1\r\nHost: origin.test:" + pt + "\r\n\r\n"},
		{"connect", "CONNECT origin%252etest:" + pt + " HTTP/1.1\r\nHost: origin.test:" + pt + "\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if resp := send(t, dial(t), tt.raw); resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Abox-Reason") != ReasonInvalidTarget {
				t.Errorf("status %d reason %q, want 400 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonInvalidTarget)
			}
		})
	}
	t.Run("absolute form in a tunnel", func(t *testing.T) {
		c := h.connect(t, "origin.test:"+pt)
		defer c.Close()
		resp := send(t, c, "GET http://origin%252etest:"+pt+"/ HTTP/1.1\r\nHost: origin.test:"+pt+"\r\n\r\n")
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("X-Abox-Reason") != ReasonInvalidTarget {
			t.Errorf("status %d reason %q, want 400 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), ReasonInvalidTarget)
		}
	})
	t.Run("control: the name spelled plainly", func(t *testing.T) {
		if resp := send(t, dial(t), "GET http://origin.test:"+pt+"/ HTTP/1.1\r\nHost: origin.test:"+pt+"\r\n\r\n"); resp.StatusCode != http.StatusOK {
			t.Errorf("status %d, want 200", resp.StatusCode)
		}
	})
}
