package httpfilter

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestH2UploadWindowBounded: an intercepted HTTP/2 connection offers the
// guest at most h2UploadWindow of flow-control window, per stream and for
// the connection: the request body bytes the proxy may have to hold for
// one guest connection while nobody reads them.
func TestH2UploadWindowBounded(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	h.res.set("origin.test", "127.0.0.1")
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "origin.test", RootCAs: h.proxyCA, NextProtos: []string{"h2"}})
	if err := tc.Handshake(); err != nil || tc.ConnectionState().NegotiatedProtocol != "h2" {
		t.Fatalf("handshake: %v, protocol %q", err, tc.ConnectionState().NegotiatedProtocol)
	}
	tc.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(tc, tc)
	fr.WriteSettings()
	stream, conn := int64(65535), int64(65535) // RFC 9113's initial windows
	// The server's first frames: its SETTINGS and the connection's
	// WINDOW_UPDATE, read until both are in (or the connection's deadline
	// ends the wait, and the windows below are the defaults), not for a
	// fixed time that a loaded machine can outlast.
	for settings, update := false, false; !settings || !update; {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				break
			}
			settings = true
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				stream = int64(v)
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				update = true
				conn += int64(f.Increment)
			}
		}
	}
	if stream > h2UploadWindow || conn > h2UploadWindow {
		t.Fatalf("the guest may send %d bytes per stream and %d per connection unread, want at most %d", stream, conn, h2UploadWindow)
	}
	if stream < h2UploadWindow || conn < h2UploadWindow {
		t.Fatalf("windows %d per stream, %d per connection: below %d, uploads would crawl", stream, conn, h2UploadWindow)
	}
}
