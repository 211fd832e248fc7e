package httpfilter

import (
	"net/http"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
)

// TestLearnMode: learn mode lets the guest reach a public name that is
// not listed, as passive mode does, but refuses an IP literal that passive
// mode allows, and every address and special-name refusal of active mode
// stays; what it allowed is recorded without the query.
func TestLearnMode(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	h.res.set("origin.test", "127.0.0.1")
	h.res.set("other.test", "127.0.0.1")
	h.res.set("private.test", "10.0.0.1")
	h.res.set("meta.test", "169.254.169.254")
	send := func(method, host, target string) (*http.Response, string) {
		return h.rawRequest(t, method+" http://"+host+":"+pt+target+" HTTP/1.1\r\nHost: "+host+"\r\nContent-Length: 0\r\n\r\n")
	}
	// The control: 127.0.0.1 is permitted in this harness, so passive
	// mode reaches it, and only learn mode's refusal of literals stops it.
	h.engine.SetMode(policy.Passive)
	if resp, body := send("GET", "127.0.0.1", "/"); resp.StatusCode != 200 {
		t.Fatalf("control: passive GET of a permitted literal = %d %q, want 200", resp.StatusCode, body)
	}
	h.engine.SetMode(policy.Learn)
	t.Run("an unlisted public name is allowed", func(t *testing.T) {
		if resp, body := send("GET", "other.test", "/a/b?token=secret"); resp.StatusCode != 200 {
			t.Errorf("status %d %q, want 200", resp.StatusCode, body)
		}
		if resp, body := send("POST", "other.test", "/upload"); resp.StatusCode != 200 {
			t.Errorf("POST: status %d %q, want 200", resp.StatusCode, body)
		}
		waitFor(t, func() bool { return h.lastLog("reason", policy.ReasonLearn) != nil }, "a learn_mode log line")
	})
	t.Run("an IP literal is refused", func(t *testing.T) {
		resp, body := send("GET", "127.0.0.1", "/")
		checkRefusal(t, resp, body, 403, allowlist.ReasonNotAllowlisted, "")
		resp, body = h.rawRequest(t, "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: x\r\n\r\n")
		checkRefusal(t, resp, body, 403, allowlist.ReasonNotAllowlisted, "")
	})
	t.Run("private and metadata addresses are refused", func(t *testing.T) {
		resp, body := send("GET", "private.test", "/")
		h.checkNameRefusal(t, resp, body, "private", "private.test")
		resp, body = send("GET", "meta.test", "/")
		h.checkNameRefusal(t, resp, body, "metadata", "meta.test")
		resp, body = send("GET", "169.254.169.254", "/")
		checkRefusal(t, resp, body, 403, "metadata", "")
	})
	t.Run("special-use names are refused", func(t *testing.T) {
		for _, n := range []string{"printer.local", "metadata.google.internal", "localhost"} {
			resp, body := send("GET", n, "/")
			checkRefusal(t, resp, body, 403, allowlist.ReasonSpecialUse, "")
		}
	})
	t.Run("the record", func(t *testing.T) {
		s := h.engine.Learned()
		if len(s.Hosts) != 1 || s.Hosts[0].Host != "other.test" {
			t.Fatalf("hosts = %+v, want other.test alone", s.Hosts)
		}
		got := map[string]bool{}
		for _, q := range s.Hosts[0].Requests {
			got[q.Method+" "+q.Path] = q.Write
		}
		if w, ok := got["GET /a/b"]; !ok || w {
			t.Errorf("requests %v: want GET /a/b (no query), not a write", got)
		}
		if w, ok := got["POST /upload"]; !ok || !w {
			t.Errorf("requests %v: want POST /upload, a write", got)
		}
		if len(got) != 2 {
			t.Errorf("requests %v: want 2", got)
		}
		for _, r := range []string{allowlist.ReasonNotAllowlisted, allowlist.ReasonSpecialUse, "private", "metadata"} {
			if s.Refused[r] == 0 {
				t.Errorf("refused %v: want %s counted", s.Refused, r)
			}
		}
	})
}
