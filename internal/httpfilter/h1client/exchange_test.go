package h1client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRetryable: only a request without a body is sent again, when its
// write failed, or when it is idempotent and the origin closed before
// answering a byte.
func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		body   bool
		header string
		err    error
		want   bool
	}{
		{"write failed, POST", "POST", false, "", ErrStaleWrite, true},
		{"write failed, with a body", "PUT", true, "", ErrStaleWrite, false},
		{"closed before answering, GET", "GET", false, "", ErrStaleRead, true},
		{"closed before answering, HEAD", "HEAD", false, "", ErrStaleRead, true},
		{"closed before answering, OPTIONS", "OPTIONS", false, "", ErrStaleRead, true},
		{"closed before answering, POST", "POST", false, "", ErrStaleRead, false},
		{"closed before answering, POST with Idempotency-Key", "POST", false, "Idempotency-Key", ErrStaleRead, true},
		{"closed before answering, POST with X-Idempotency-Key", "POST", false, "X-Idempotency-Key", ErrStaleRead, true},
		{"closed before answering, GET with a body", "GET", true, "", ErrStaleRead, false},
		{"another error, GET", "GET", false, "", io.ErrUnexpectedEOF, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(tc.method, "http://origin.test/", nil)
			if tc.body {
				r.Body = io.NopCloser(strings.NewReader("x"))
			}
			if tc.header != "" {
				r.Header[tc.header] = []string{"1"}
			}
			if got := Retryable(tc.err, r); got != tc.want {
				t.Errorf("Retryable(%v, %s) = %v, want %v", tc.err, tc.method, got, tc.want)
			}
		})
	}
}

// TestReadResponse: informational answers but 100 Continue go to info
// before the final one; an origin that closes before a byte is a stale
// read; a 101 nobody asked for and a header past MaxResponseHeader are
// refused.
func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		name     string
		answer   string
		wantInfo []int
		wantErr  error // nil: a 200 with body "ok"
	}{
		{"informational", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", []int{103}, nil},
		{"closed before a byte", "", nil, ErrStaleRead},
		{"switching protocols", "HTTP/1.1 101 Switching Protocols\r\n\r\n", nil, errors.New("101")},
		{"header too large", "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", MaxResponseHeader) + "\r\n\r\n", nil, ErrResponseHeaderTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, peer, _ := pipeConn(t)
			go func() {
				br := bufio.NewReader(peer)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(peer, tc.answer)
				peer.Close()
			}()
			out, _ := http.NewRequest("GET", "http://origin.test/", nil)
			up, err := u.Send(out, nil, nil, "")
			if err != nil || up != nil {
				t.Fatalf("send: %v, upload %v", err, up != nil)
			}
			var info []int
			resp, err := u.ReadResponse(context.Background(), out, up, nil, func(r *http.Response) { info = append(info, r.StatusCode) })
			switch {
			case tc.wantErr == nil:
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 200 || string(b) != "ok" {
					t.Errorf("got %d %q, want 200 ok", resp.StatusCode, b)
				}
			case tc.wantErr.Error() == "101":
				if err == nil || !strings.Contains(err.Error(), "101") {
					t.Errorf("read: %v, want a refused 101", err)
				}
			case !errors.Is(err, tc.wantErr):
				t.Errorf("read: %v, want %v", err, tc.wantErr)
			}
			if len(info) != len(tc.wantInfo) || (len(info) > 0 && info[0] != tc.wantInfo[0]) {
				t.Errorf("informational answers passed on %v, want %v", info, tc.wantInfo)
			}
		})
	}
}
