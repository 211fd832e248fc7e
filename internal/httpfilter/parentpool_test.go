package httpfilter

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/abox-dev/abox/internal/egress"
)

// TestParentProxyConnectionsReused: with --upstream-proxy, a second request
// to the same origin reuses the tunnel through the parent. The pool keyed
// its connections by the socket's remote address (the parent's) and looked
// them up by the checked address, so every request was a new TCP
// connection and CONNECT at the parent.
func TestParentProxyConnectionsReused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var connects atomic.Int32
	serveRaw(t, ln, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil || req.Method != http.MethodConnect {
			return
		}
		connects.Add(1)
		up, err := net.Dial("tcp", req.Host)
		if err != nil {
			io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
			return
		}
		defer up.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
		go io.Copy(up, br)
		io.Copy(c, up)
	})
	pp, err := egress.NewParentProxy("http://"+ln.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, hopts{allow: []string{"origin.test"}, upDialer: pp})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.allowOrigin("origin.test", o, pt)
	c := h.client(false)
	for i := range 3 {
		req, _ := http.NewRequest("GET", "http://origin.test:"+pt+"/", nil)
		resp, e, body := getJSON(t, c, req)
		if resp.StatusCode != 200 || e.Host != "origin.test:"+pt {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := connects.Load(); n != 1 {
		t.Errorf("3 requests to one origin made %d CONNECTs at the parent, want 1 (the connection reused)", n)
	}
}
