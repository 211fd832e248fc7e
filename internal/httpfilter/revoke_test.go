package httpfilter

import (
	"crypto/tls"
	"testing"

	"github.com/abox-dev/abox/internal/policy"
)

// TestRevokedOnPolicyChange: a plain-HTTP stream, a byte tunnel and an
// intercepted tunnel that a policy allowed are closed when the policy stops
// allowing their host, by a mode switch (passive to active) or by removing
// entries from the allowlist (no mode change); a stream whose host is still
// allowed keeps flowing. (The helpers are in revoke_inflight_test.go.)
func TestRevokedOnPolicyChange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		passive bool
		allow   []string
		change  func(h *harness) error
	}{
		{"passive to active", true, []string{"kept.test"}, func(h *harness) error { h.engine.SetMode(policy.Active); return nil }},
		{"entries removed", false, []string{"kept.test", "plain.test", "tunnel.test", "mitm.test"}, func(h *harness) error {
			_, err := h.engine.Remove("plain.test", "tunnel.test", "mitm.test")
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, hopts{passive: tc.passive, allow: tc.allow, exceptions: []string{"tunnel.test"}})
			o, so := newHTTPOrigin(t, streamMux()), newHTTPSOrigin(t, streamMux())
			pt, spt := port(t, o), port(t, so)
			for _, n := range []string{"kept.test", "plain.test", "tunnel.test", "mitm.test"} {
				h.allowOrigin(n, o, pt)
			}
			h.p.ports[uint16(mustAtoi(spt))] = true
			kept := openStream(t, "kept", h.dialProxy(t), "GET http://kept.test:"+pt+"/stream HTTP/1.1\r\nHost: kept.test\r\n\r\n")
			streams := map[string]<-chan string{
				"plain": openStream(t, "plain", h.dialProxy(t), "GET http://plain.test:"+pt+"/stream HTTP/1.1\r\nHost: plain.test\r\n\r\n"),
				"tunnel": openStream(t, "tunnel", tls.Client(h.connect(t, "tunnel.test:"+spt), &tls.Config{RootCAs: h.roots, ServerName: "tunnel.test", NextProtos: []string{"http/1.1"}}),
					"GET /stream HTTP/1.1\r\nHost: tunnel.test:"+spt+"\r\n\r\n"),
				"mitm": openStream(t, "mitm", tls.Client(h.connect(t, "mitm.test:"+spt), &tls.Config{RootCAs: h.proxyCA, ServerName: "mitm.test", NextProtos: []string{"http/1.1"}}),
					"GET /stream HTTP/1.1\r\nHost: mitm.test:"+spt+"\r\n\r\n"),
			}
			if err := tc.change(h); err != nil {
				t.Fatal(err)
			}
			for name, ch := range streams {
				waitClosed(t, name, ch)
			}
			stillFlowing(t, "kept", kept)
			// The line is written once the revoked stream's handler has
			// returned, which can be after the guest saw its close.
			h.waitLog(t, ReasonRevoked)
		})
	}
}
