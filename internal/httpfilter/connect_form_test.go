package httpfilter

import (
	"testing"
)

// TestConnectNeedsAuthorityForm: a CONNECT whose request target is not
// host:port (net/http accepts an origin-form path and takes the Host
// header instead) is 400 invalid_target, whatever the Host header names,
// and nothing is resolved or dialled.
func TestConnectNeedsAuthorityForm(t *testing.T) {
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"allowed.test"}, dialer: d})
	h.res.set("allowed.test", "127.0.0.1")
	for _, target := range []string{"/", "/allowed.test:443", "/x?y",
		// URLs net/http parses, keeping their host: a path, a query, userinfo.
		"allowed.test:443/x", "allowed.test:443/", "allowed.test:443?x", "allowed.test:443?", "u@allowed.test:443", "evil.test:1@allowed.test:443"} {
		resp, body := h.rawRequest(t, "CONNECT "+target+" HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
		checkRefusal(t, resp, body, 400, ReasonInvalidTarget, "")
	}
	if got := d.dialed(); len(got) != 0 {
		t.Errorf("dialled %v", got)
	}
	if n := h.res.count("allowed.test"); n != 0 {
		t.Errorf("resolved allowed.test %d times", n)
	}
	// Authority form is unchanged.
	resp, body := h.rawRequest(t, "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Errorf("CONNECT allowed.test:443: %d %q", resp.StatusCode, body)
	}
}
