package httpfilter

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

func TestSmoke(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}, ports: []uint16{80, 443}})
	o := newHTTPOrigin(t, originMux())
	so := newHTTPSOrigin(t, originMux())
	h.res.set("origin.test", "127.0.0.1")
	h.p.ports[uint16(mustAtoi(port(t, o)))] = true
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	for _, u := range []string{"http://origin.test:" + port(t, o) + "/a?b=c", "https://origin.test:" + port(t, so) + "/x"} {
		for _, h2 := range []bool{false, true} {
			resp, err := h.client(h2).Get(u)
			if err != nil {
				t.Fatal(err)
			}
			var e echoReply
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			json.Unmarshal(b, &e)
			t.Logf("%s h2=%v: %d %s %+v", u, h2, resp.StatusCode, resp.Proto, e)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("status %d: %s", resp.StatusCode, b)
			}
		}
	}
	t.Log(h.log.b.String())
}

func mustAtoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
