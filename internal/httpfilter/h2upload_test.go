package httpfilter

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// TestH2UploadAfterResponse: an origin that answers before reading the
// request body (a refusal, or a handler that ignores it) does not get the
// guest's HTTP/2 stream reset under its upload: the proxy takes the rest
// of the body (bounded), so the stream ends with the guest's END_STREAM.
// Reset, curl 7.88 reports a framing error instead of the response.
func TestH2UploadAfterResponse(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	o := newHTTPSOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "answered before the body\n")
	}))
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	h.res.set("origin.test", "127.0.0.1")
	pr, pw := io.Pipe()
	req, err := http.NewRequest("POST", "https://origin.test:"+pt+"/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 4
	resp, err := h.client(true).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 {
		t.Fatalf("response %s %d, want HTTP/2 200", resp.Proto, resp.StatusCode)
	}
	// The guest is slow: its body comes after the response's headers.
	time.Sleep(200 * time.Millisecond)
	if _, err := pw.Write([]byte("x=1\n")); err != nil {
		t.Errorf("the upload after the response failed (%v): the stream was reset under it", err)
	}
	pw.Close()
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "answered before the body\n" {
		t.Errorf("response body %q, %v", b, err)
	}
}
