package connio

import (
	"strings"
	"testing"
)

// scanAll feeds b to a fresh guard in pieces of size step and returns the
// refusal reason ("" if none) and the state reached.
func scanAll(b []byte, step int) (string, h1State) {
	g := &H1Guard{maxHeader: 1024, first: true}
	for len(b) > 0 {
		n := min(step, len(b))
		if rej := g.scan(b[:n]); rej != nil {
			return rej.reason, g.st
		}
		b = b[n:]
	}
	return "", g.st
}

func TestH1GuardFraming(t *testing.T) {
	tests := []struct {
		name, in   string
		wantReason string
		wantState  h1State
	}{
		{"two requests", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", "", stHeader},
		{"body skipped", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nX-A: a\r\n b\r\n", "", stHeader},
		{"chunked skipped", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n\r\n a\r\n\r\n0\r\n\r\n", "", stHeader},
		{"after chunked", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nA: a\r\n b\r\n", "obs_fold", stHeader},
		{"connect passes", "CONNECT a:443 HTTP/1.1\r\n\r\n\x16\x03\x01 a\r\n b\r\n", "", stPass},
		{"bad chunk size", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "invalid_chunk", stChunkSize},
		{"chunk without crlf", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\naXY\r\n", "invalid_chunk", stChunkEnd},
		{"trailer fold", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: a\r\n b\r\n\r\n", "obs_fold", stTrailer},
		{"no host", "GET http://a/ HTTP/1.1\r\nX: y\r\n\r\n", "missing_host", stHeader},
		{"no host http/1.0", "GET http://a/ HTTP/1.0\r\n\r\n", "", stHeader},
		{"bad host", "GET http://a/ HTTP/1.1\r\nHost: a b\r\n\r\n", "malformed_host", stHeader},
		{"oversized", "GET http://a/ HTTP/1.1\r\nX: " + strings.Repeat("a", 2000) + "\r\n\r\n", "headers_too_large", stHeader},
	}
	for _, tt := range tests {
		for _, step := range []int{1, 3, 1 << 20} {
			gotReason, gotState := scanAll([]byte(tt.in), step)
			if gotReason != tt.wantReason || gotState != tt.wantState {
				t.Errorf("%s (step %d): reason %q state %d, want %q %d", tt.name, step, gotReason, gotState, tt.wantReason, tt.wantState)
			}
		}
	}
}

// FuzzH1Guard: the guard is an incremental parser, so how the bytes are
// split across reads must never change its verdict or its state.
func FuzzH1Guard(f *testing.F) {
	f.Add([]byte("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 3)
	f.Add([]byte("GET http://a/ HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\nX: a\r\n b\r\n"), 1)
	f.Fuzz(func(t *testing.T, b []byte, step int) {
		if step < 1 || step > len(b)+1 {
			step = 1
		}
		r1, s1 := scanAll(b, len(b)+1)
		r2, s2 := scanAll(b, step)
		if r1 != r2 || s1 != s2 {
			t.Fatalf("split at %d changes the verdict: %q/%d vs %q/%d", step, r2, s2, r1, s1)
		}
	})
}
