package h1

import (
	"bufio"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"testing"
)

// TestRemoveHopByHopBothWays: the walk over a small header and the probes
// of a large one remove the same fields: every hop-by-hop name, every name
// Connection lists, nothing else.
func TestRemoveHopByHopBothWays(t *testing.T) {
	for _, extra := range []int{0, len(hopHeaders) + 1} {
		h := http.Header{"Connection": {"X-Private, keep-alive"}, "X-Private": {"1"}, "Accept": {"*/*"}}
		for _, k := range hopHeaders[1:] { // Connection is set above
			h[k] = []string{"v"}
		}
		for i := 0; i < extra; i++ {
			h[fmt.Sprintf("X-Extra-%d", i)] = []string{"v"}
		}
		RemoveHopByHop(h)
		for _, k := range append([]string{"X-Private"}, hopHeaders...) {
			if _, ok := h[k]; ok {
				t.Errorf("%d extra fields: %s kept", extra, k)
			}
		}
		if len(h) != 1+extra {
			t.Errorf("%d extra fields: %d left, want %d: %v", extra, len(h), 1+extra, h)
		}
	}
	for _, k := range hopHeaders {
		if !IsHopHeader(k) {
			t.Errorf("IsHopHeader(%q) = false", k)
		}
	}
	if IsHopHeader("Accept") || IsHopHeader("connection") {
		t.Error("IsHopHeader takes other names")
	}
}

// TestWriteRequestAsRequestWrite: the upstream request writer's fast path
// puts the same request on the wire as Request.Write, header order aside
// (it writes them unsorted), and leaves every other request to it.
func TestWriteRequestAsRequestWrite(t *testing.T) {
	mk := func(method, target, host string, h http.Header) *http.Request {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Request{Method: method, URL: u, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Host: host, Header: h}
	}
	cases := []*http.Request{
		mk("GET", "http://a.test/x", "a.test", http.Header{"User-Agent": {""}, "Accept": {"*/*"}}),
		mk("GET", "http://a.test:8080/p%20q/r?s=1&t=%2F", "a.test:8080", http.Header{"User-Agent": {" curl/8\r"}, "X-Multi": {"1", "2"}, "Cookie": {"a=b"}}),
		mk("HEAD", "http://[::1]:81/", "[::1]:81", http.Header{"X-Cr": {"a\rb\nc"}, "X-Pad": {"  v  "}}),
		mk("GET", "http://a.test/", "a.test", http.Header{"Bad Name": {"v"}, "Content-Length": {"5"}, "Trailer": {"X"}, "Host": {"other.test"}}),
		mk("GET", "http://a.test/", "a.test", http.Header{}),
		mk("POST", "http://a.test/", "a.test", http.Header{"User-Agent": {""}}),
		mk("GET", "http://a.test/", "bücher.test", http.Header{"User-Agent": {""}}),
		// obs-text and control bytes that only Unicode trimming would
		// take off: Request.Write trims spaces, tabs, CR and LF alone.
		mk("GET", "http://a.test/", "a.test", http.Header{"User-Agent": {"\u00a0ua\u0085"}, "X-Nbsp": {"\u00a0v\u00a0"}, "X-Ctl": {"\vv\f"}, "X-Wide": {"\u3000v\u2003"}}),
	}
	for i, r := range cases {
		var want, got strings.Builder
		bw := bufio.NewWriter(&want)
		if err := r.Write(bw); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		bw = bufio.NewWriter(&got)
		if err := WriteRequest(bw, r); err != nil {
			t.Fatal(err)
		}
		bw.Flush()
		if sortedLines(got.String()) != sortedLines(want.String()) {
			t.Errorf("case %d:\n got %q\nwant %q", i, got.String(), want.String())
		}
	}
}

// sortedLines is a request head with its field lines sorted (the request
// line stays first).
func sortedLines(s string) string {
	head, rest, _ := strings.Cut(s, "\r\n")
	lines := strings.Split(strings.TrimSuffix(rest, "\r\n\r\n"), "\r\n")
	sort.Strings(lines)
	return head + "|" + strings.Join(lines, "|") + "|" + strings.TrimPrefix(rest, strings.TrimSuffix(rest, "\r\n\r\n"))
}

// TestWriteFieldsAsHeaderWrite: the header blocks the server loop writes
// to the guest carry each value as http.Header.Write does: only spaces,
// tabs, CR and LF are trimmed, never obs-text (U+00A0, U+0085) or other
// control bytes, so a field keeps its bytes across the proxy.
func TestWriteFieldsAsHeaderWrite(t *testing.T) {
	h := http.Header{"X-Nbsp": {"\u00a0v\u00a0"}, "X-Nel": {"v\u0085"}, "X-Ctl": {"\vv\f"}, "X-Pad": {" \tv\t "}, "X-Crlf": {"a\r\nb"}}
	var want, got strings.Builder
	h.Write(&want)
	bw := bufio.NewWriter(&got)
	writeFields(bw, h, nil)
	bw.Flush()
	if sortedLines("x\r\n"+got.String()+"\r\n") != sortedLines("x\r\n"+want.String()+"\r\n") {
		t.Errorf("got %q\nwant %q", got.String(), want.String())
	}
}
