package httpfilter

import (
	"bufio"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"golang.org/x/crypto/cryptobyte"
)

// echConfigList builds a valid ECHConfigList (RFC 9849) whose public name is
// publicName, so Go's client sends a real Encrypted Client Hello whose outer
// server name is publicName.
func echConfigList(t *testing.T, publicName string) []byte {
	t.Helper()
	priv, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var b cryptobyte.Builder
	b.AddUint16LengthPrefixed(func(l *cryptobyte.Builder) {
		l.AddUint16(extECH)
		l.AddUint16LengthPrefixed(func(c *cryptobyte.Builder) {
			c.AddUint8(7)     // config_id
			c.AddUint16(0x20) // DHKEM(X25519, HKDF-SHA256)
			c.AddUint16LengthPrefixed(func(k *cryptobyte.Builder) { k.AddBytes(priv.PublicKey().Bytes()) })
			c.AddUint16LengthPrefixed(func(s *cryptobyte.Builder) { s.AddUint16(1); s.AddUint16(1) }) // HKDF-SHA256, AES-128-GCM
			c.AddUint8(0)                                                                             // maximum_name_length
			c.AddUint8LengthPrefixed(func(n *cryptobyte.Builder) { n.AddBytes([]byte(publicName)) })
			c.AddUint16(0) // extensions
		})
	})
	return b.BytesOrPanic()
}

// captureHello returns the first TLS record a Go client with cfg sends: its
// ClientHello, as a hostile guest would replay it.
func captureHello(t *testing.T, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go tls.Client(a, cfg).Handshake()
	rec, err := readRecord(b)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// newHRROrigin is an HTTPS origin that accepts only P-256 key shares, which
// Go's client does not send first: every handshake takes a HelloRetryRequest.
func newHRROrigin(t *testing.T) *httptest.Server {
	s := httptest.NewUnstartedServer(originMux())
	oca := testOriginCA(t)
	s.TLS = &tls.Config{
		CurvePreferences: []tls.CurveID{tls.CurveP256},
		NextProtos:       []string{"http/1.1"},
		GetCertificate:   func(h *tls.ClientHelloInfo) (*tls.Certificate, error) { return oca.Leaf(h.ServerName) },
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (h *harness) waitLog(t *testing.T, reason string) map[string]any {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if l := h.lastLog("reason", reason); l != nil {
			return l
		}
	}
	t.Errorf("no log line with reason %s", reason)
	return nil
}

func closedWithin(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, c)
	return err == nil // EOF: the proxy closed it; a timeout is an error
}

// TestTunnelRefusesECH: a byte tunnel (--no-mitm, MITM exceptions) refuses a
// ClientHello carrying Encrypted Client Hello although its readable (outer)
// server name is the CONNECT host: the inner name, which the server acts on,
// is unreadable. Nothing is dialled.
func TestTunnelRefusesECH(t *testing.T) {
	for _, o := range []hopts{{noMITM: true}, {exceptions: []string{"tunnel.test"}}} {
		o.allow = []string{"tunnel.test"}
		o.dialer = &recordingDialer{}
		h := newHarness(t, o)
		so := newHTTPSOrigin(t, originMux())
		spt := port(t, so)
		h.allowOrigin("tunnel.test", so, spt)
		c := h.connect(t, "tunnel.test:"+spt)
		err := tls.Client(c, &tls.Config{
			ServerName: "hidden.example.org", RootCAs: h.roots, MinVersion: tls.VersionTLS13,
			EncryptedClientHelloConfigList: echConfigList(t, "tunnel.test"),
		}).Handshake()
		if err == nil {
			t.Fatalf("noMITM=%v: ECH handshake through the tunnel succeeded", o.noMITM)
		}
		h.waitLog(t, ReasonECH)
		if n := len(o.dialer.dialed()); n != 0 {
			t.Errorf("noMITM=%v: an ECH hello was relayed (%d dials)", o.noMITM, n)
		}
	}
}

// TestTunnelChecksRetriedHello: after a HelloRetryRequest the client's
// second ClientHello is checked before it is relayed. A legitimate retry
// completes; a second hello for another server, or one that adds ECH, closes
// the tunnel.
func TestTunnelChecksRetriedHello(t *testing.T) {
	h := newHarness(t, hopts{noMITM: true, allow: []string{"tunnel.test"}})
	so := newHRROrigin(t)
	spt := port(t, so)
	h.allowOrigin("tunnel.test", so, spt)

	t.Run("legitimate retry", func(t *testing.T) {
		tc := tls.Client(h.connect(t, "tunnel.test:"+spt), &tls.Config{ServerName: "tunnel.test", RootCAs: h.roots, NextProtos: []string{"http/1.1"}})
		defer tc.Close()
		if err := tc.Handshake(); err != nil {
			t.Fatalf("handshake with a retry: %v", err)
		}
		if cs := tc.ConnectionState(); cs.CurveID != tls.CurveP256 {
			t.Fatalf("curve %v: the origin did not force a HelloRetryRequest", cs.CurveID)
		}
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: tunnel.test\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request after the retry: %v %v", resp, err)
		}
	})
	first := captureHello(t, &tls.Config{ServerName: "tunnel.test", CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256}, NextProtos: []string{"http/1.1"}})
	for _, tc := range []struct {
		name   string
		second []byte
		reason string
	}{
		{"another server", captureHello(t, &tls.Config{ServerName: "evil.example.org", NextProtos: []string{"http/1.1"}}), ReasonSNIMismatch},
		{"adds ECH", captureHello(t, &tls.Config{ServerName: "evil.example.org", MinVersion: tls.VersionTLS13, EncryptedClientHelloConfigList: echConfigList(t, "tunnel.test")}), ReasonECH},
		{"other protocols", captureHello(t, &tls.Config{ServerName: "tunnel.test", NextProtos: []string{"h2"}}), ReasonHelloRetryChanged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := h.connect(t, "tunnel.test:"+spt)
			defer c.Close()
			c.Write(first)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, hrr, err := readServerHello(c); err != nil || !hrr {
				t.Fatalf("want a HelloRetryRequest from the origin: hrr=%v err=%v", hrr, err)
			}
			c.Write(tc.second)
			if !closedWithin(t, c) {
				t.Errorf("the tunnel stayed open after a second hello that changed (%s)", tc.name)
			}
			h.waitLog(t, tc.reason)
		})
	}
}

// TestIPLiteralConnectNeedsMatchingSNI: a CONNECT to an IP literal (allowed
// in passive mode) may carry no SNI or the literal itself; a host name in
// the SNI is another server and is refused, intercepted or tunnelled.
func TestIPLiteralConnectNeedsMatchingSNI(t *testing.T) {
	for _, o := range []hopts{{passive: true}, {passive: true, noMITM: true}} {
		h := newHarness(t, o)
		so := newHTTPSOrigin(t, originMux())
		spt := port(t, so)
		h.p.ports[uint16(mustAtoi(spt))] = true
		roots := h.proxyCA
		if o.noMITM {
			roots = h.roots
		}
		c := h.connect(t, "127.0.0.1:"+spt)
		err := tls.Client(c, &tls.Config{ServerName: "evil.example.org", RootCAs: roots}).Handshake()
		c.Close()
		if err == nil {
			t.Errorf("noMITM=%v: a TLS session for evil.example.org ran through CONNECT 127.0.0.1", o.noMITM)
		}
		if l := h.waitLog(t, ReasonSNIMismatch); l != nil && l["sni"] != "evil.example.org" {
			t.Errorf("noMITM=%v: log line sni = %v", o.noMITM, l["sni"])
		}
	}
}
