package httpfilter

import (
	"crypto/tls"
	"testing"
	"time"
)

// TestSNISpelledAsTheProxyDecodesIt: a ClientHello whose server name
// matches the CONNECT host only once decoded (percent-encoding, Unicode
// that IDNA maps to it) is refused as sni_mismatch, intercepted or
// tunnelled: in a byte tunnel the origin reads the raw bytes, not the
// proxy's decoding, and routes them to whatever vhost it likes. Case is a
// spelling every server folds: it still matches.
func TestSNISpelledAsTheProxyDecodesIt(t *testing.T) {
	for _, mode := range []struct {
		name string
		o    hopts
	}{{"mitm", hopts{}}, {"no-mitm", hopts{noMITM: true}}} {
		mode.o.allow = []string{"origin.test"}
		h := newHarness(t, mode.o)
		so := newHTTPSOrigin(t, originMux())
		pt := port(t, so)
		h.allowOrigin("origin.test", so, pt)
		for _, tt := range []struct {
			sni string
			ok  bool
		}{
			{"origin%2etest", false},
			{"%6frigin.test", false},
			{"ｏｒｉｇｉｎ.test", false},
			{"origin。test", false},
			{"ORIGIN.Test", true},
		} {
			t.Run(mode.name+"/"+tt.sni, func(t *testing.T) {
				c := h.connect(t, "origin.test:"+pt)
				defer c.Close()
				tc := tls.Client(c, &tls.Config{ServerName: tt.sni, InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
				tc.SetDeadline(time.Now().Add(5 * time.Second))
				err := tc.Handshake()
				if tt.ok {
					if err != nil {
						t.Fatalf("handshake with SNI %q: %v", tt.sni, err)
					}
					return
				}
				if err == nil {
					t.Fatalf("handshake with SNI %q succeeded", tt.sni)
				}
				tc.Close()
				waitFor(t, func() bool {
					l := h.lastLog("reason", ReasonSNIMismatch)
					return l != nil && l["sni"] == tt.sni
				}, "log line with reason "+ReasonSNIMismatch+" and sni "+tt.sni)
			})
		}
	}
}
