package httpfilter

import (
	"io"
	"net/http"
	"testing"
)

// TestUpgradeRequestsGetNoStaleConnection: a WebSocket upgrade the origin
// answers without switching (200, 403) does not leave a connection that a
// later upgrade request for the same name reuses: each upgrade is dialled to
// an address its own decision checked, so a name that now resolves
// elsewhere never gets the old connection (as for the upstream pool).
func TestUpgradeRequestsGetNoStaleConnection(t *testing.T) {
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"ws.test"}, dialer: d, permit: []string{"127.0.0.0/8"}})
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "no upgrade here\n") })
	o := newHTTPOrigin(t, mux)
	pt := port(t, o)
	h.allowOrigin("ws.test", o, pt)
	req := "GET http://ws.test:" + pt + "/ HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if resp, body := h.rawRequest(t, req); resp.StatusCode != 200 {
		t.Fatalf("first upgrade: %d %q", resp.StatusCode, body)
	}
	// The name moves: the next decision checks 127.0.0.2.
	h.res.set("ws.test", "127.0.0.2")
	h.rawRequest(t, req)
	got := d.dialed()
	if len(got) != 2 || got[1] != "127.0.0.2:"+pt {
		t.Errorf("dialled %v, want a second dial to the newly checked 127.0.0.2:%s", got, pt)
	}
}
