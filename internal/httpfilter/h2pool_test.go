package httpfilter

import (
	"fmt"
	"io"
	"testing"
)

// TestH2PoolIsBounded: each new name under an allowlisted wildcard gets a
// shared HTTP/2 connection of its own, kept after its request; past the
// pool's bound the one idle longest is closed for the new one, so a guest
// walking through names cannot make the proxy hold a connection (a file
// descriptor, its memory) per name. Requests keep being answered.
func TestH2PoolIsBounded(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"*.origin.test"}})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.p.ports[uint16(mustAtoi(pt))] = true
	h.p.pool.SetMaxH2(4)
	c := h.client(false)
	const names = 10
	for i := range names {
		name := fmt.Sprintf("n%d.origin.test", i)
		h.res.set(name, "127.0.0.1")
		resp, err := c.Get("https://" + name + ":" + pt + "/")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", name, resp.StatusCode)
		}
	}
	if _, total := h.p.pool.Held(); total > 4 {
		t.Fatalf("the pool holds %d HTTP/2 connections after %d names, want at most 4", total, names)
	}
	if ev := h.p.Stats().(Stats).UpstreamH2Evicted; ev != names-4 {
		t.Fatalf("evicted %d, want %d", ev, names-4)
	}
}
