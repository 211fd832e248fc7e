package httpfilter

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"
)

// TestInterceptedBulkBody: a large body of known length from an HTTPS
// origin reaches the intercepted guest byte for byte (twice, over one
// upstream connection that the large reads leave reusable); a body the
// origin cuts short arrives broken; and bytes already received from the
// origin are passed on while the origin pauses mid-body, never held until
// more arrive.
func TestInterceptedBulkBody(t *testing.T) {
	const size = 3<<20 + 12345
	body := pattern(size)
	const first = 200 << 10
	received := make(chan struct{})
	paused := make(chan bool, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/pattern", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body)
	})
	mux.HandleFunc("/pause", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body[:first])
		w.(http.Flusher).Flush()
		select {
		case <-received:
			paused <- true
		case <-time.After(30 * time.Second): // only ends a hang
			paused <- false
		}
		w.Write(body[first:])
	})
	mux.HandleFunc("/cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		w.Write(body[:size/3])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := startOriginWith(t, "bulk", "", true, false, mux)
	h.allowOrigin("origin.test", o, port(t, o.Server))
	base := "https://origin.test:" + port(t, o.Server)
	c := h.client(false)
	for i := 0; i < 2; i++ {
		resp, err := c.Get(base + "/pattern")
		if err != nil {
			t.Fatal(err)
		}
		wantExact(t, i, resp, body)
	}
	if n := o.opened.Load(); n != 1 {
		t.Errorf("origin saw %d connections for two downloads, want 1 (reused after a bulk body)", n)
	}

	resp, err := c.Get(base + "/pause")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	got := make([]byte, first)
	if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, body[:first]) {
		t.Fatalf("first part of a paused body: %v, exact %v", err, bytes.Equal(got, body[:first]))
	}
	close(received)
	if !<-paused {
		t.Fatal("the origin's first bytes never reached the guest while it paused: the proxy held them")
	}
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err != nil || !bytes.Equal(rest, body[first:]) {
		t.Fatalf("rest of the paused body: %d bytes, %v", len(rest), err)
	}

	resp, err = c.Get(base + "/cut")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil || n >= size {
		t.Errorf("a body cut short by the origin arrived as %d bytes with err %v; want a broken response", n, err)
	}
}
