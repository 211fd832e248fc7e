package httpfilter

import (
	"net/http"
	"testing"
)

// TestProtocols: HTTP/1.1 and HTTP/2 on the guest side, and HTTP/2 to an
// origin that offers it, all through the same decision path.
func TestProtocols(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPOrigin(t, originMux())
	so := newHTTPSOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	h.p.ports[uint16(mustAtoi(port(t, so)))] = true
	tests := []struct {
		name, url              string
		h2                     bool
		wantClient, wantOrigin string
	}{
		{"plain http", "http://origin.test:" + port(t, o) + "/a?b=c", false, "HTTP/1.1", "HTTP/1.1"},
		{"https h1 guest, h2 origin", "https://origin.test:" + port(t, so) + "/x", false, "HTTP/1.1", "HTTP/2.0"},
		{"https h2 guest, h2 origin", "https://origin.test:" + port(t, so) + "/x", true, "HTTP/2.0", "HTTP/2.0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", tt.url, nil)
			resp, e, body := getJSON(t, h.client(tt.h2), req)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if resp.Proto != tt.wantClient || e.Proto != tt.wantOrigin {
				t.Errorf("guest %s, origin %s; want %s, %s", resp.Proto, e.Proto, tt.wantClient, tt.wantOrigin)
			}
			if e.Path != req.URL.Path || e.Query != req.URL.RawQuery {
				t.Errorf("origin got %s?%s, want %s?%s", e.Path, e.Query, req.URL.Path, req.URL.RawQuery)
			}
		})
	}
}

func mustAtoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
