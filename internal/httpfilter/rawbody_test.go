package httpfilter

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"testing"
)

// pattern is n deterministic, non-repeating bytes.
func pattern(n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{1, 2, 3})
	r.Read(b)
	return b
}

// wantExact reads resp's body and fails download i unless it is body,
// byte for byte.
func wantExact(t *testing.T, i int, resp *http.Response, body []byte) {
	t.Helper()
	hs := sha256.New()
	n, err := io.Copy(hs, resp.Body)
	resp.Body.Close()
	match := [32]byte(hs.Sum(nil)) == sha256.Sum256(body)
	if err != nil || n != int64(len(body)) || !match {
		t.Fatalf("download %d: %d bytes, err %v, digest match %v; want %d exact bytes", i, n, err, match, len(body))
	}
}

// TestBulkBodyExact: a large plain-HTTP body relayed straight between the
// connections (connio.H1Guard.ReadFrom) arrives byte for byte, the upstream
// connection is reused after it, and a body the origin cuts short reaches
// the guest as a broken response, never as a whole one.
func TestBulkBodyExact(t *testing.T) {
	const size = 3<<20 + 12345
	body := pattern(size)
	mux := http.NewServeMux()
	mux.HandleFunc("/pattern", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body)
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
		brw.Write(body[:size/3])
		brw.Flush()
	})
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := startConnOriginMux(t, mux)
	h.allowOrigin("origin.test", o, port(t, o.Server))
	c := h.dialProxy(t)
	defer c.Close()
	br := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		fmt.Fprintf(c, "GET http://origin.test:%s/pattern HTTP/1.1\r\nHost: origin.test\r\n\r\n", port(t, o.Server))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantExact(t, i, resp, body)
	}
	if got := h.p.stats.bulkBodies.Load(); got != 2 {
		t.Errorf("%d bodies relayed in bulk, want 2", got)
	}
	if n := o.opened.Load(); n != 1 {
		t.Errorf("origin saw %d connections for two downloads, want 1 (reused after a bulk body)", n)
	}

	fmt.Fprintf(c, "GET http://origin.test:%s/cut HTTP/1.1\r\nHost: origin.test\r\n\r\n", port(t, o.Server))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	if err == nil || n >= size {
		t.Errorf("a body cut short by the origin arrived as %d bytes with err %v; want a broken response", n, err)
	}
}
