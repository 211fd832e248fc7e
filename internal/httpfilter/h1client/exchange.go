package h1client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
)

// Errors of an exchange that failed before the origin answered: the
// caller answers the guest (502, 504, 400).
var (
	// ErrStaleWrite and ErrStaleRead are exchanges that failed on a reused
	// connection before the origin sent a byte: it closed the connection
	// while idle. Retryable says which may be sent again.
	ErrStaleWrite = errors.New("writing to upstream: connection closed")
	ErrStaleRead  = errors.New("reading upstream response: connection closed before any byte")
	// ErrBodyCut: the request body broke (cut, bad chunking) before the
	// origin's answer was read.
	ErrBodyCut = errors.New("the guest's request body was cut before the origin answered")
	// ErrResponseHeaderTimeout: no response header within
	// ResponseHeaderTimeout of the request's end (a timeout: 504).
	ErrResponseHeaderTimeout = fmt.Errorf("reading upstream response header: %w", os.ErrDeadlineExceeded)
	// ErrUploadPanic ends an exchange whose body writer panicked.
	ErrUploadPanic = errors.New("writing the request body upstream: panic (see the daemon log)")
)

// Retryable reports whether r, which failed with err on a reused
// connection, may be sent again on a new one: it has no body, and writing
// it failed, or it is idempotent (as http.Transport decides); otherwise
// the origin may have acted on it.
func Retryable(err error, r *http.Request) bool {
	if r.Body != nil && r.Body != http.NoBody {
		return false
	}
	if errors.Is(err, ErrStaleWrite) {
		return true
	}
	if !errors.Is(err, ErrStaleRead) {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	_, a := r.Header["Idempotency-Key"]
	_, b := r.Header["X-Idempotency-Key"]
	return a || b
}

// Upload is a request body being written by a goroutine of its own while
// the answer is read: an origin may answer (413, 401) before it has read
// the body. It shares with the reader whether the response header has
// arrived (its timeout starts only once the body is sent) and how the
// write ended.
type Upload struct {
	mu      sync.Mutex
	hdrDone bool
	done    chan error
}

// Finished reports whether the body was written whole; false while it is
// still being written (the origin answered before it took the whole body:
// closing the connection ends the writer). True for a request without a
// body (a nil Upload).
func (up *Upload) Finished() bool {
	if up == nil {
		return true
	}
	select {
	case err := <-up.done:
		return err == nil
	default:
		return false
	}
}

// Send writes out on u: at once when it has no body (a nil Upload), else
// from a goroutine of its own. cut, when set, is the flag by which the
// body's sender says it cut the body: the origin's answer is then not
// waited for, and a panic of the writer (reported to panics with client)
// sets it, since where the body stopped is not known.
func (u *Conn) Send(out *http.Request, cut *atomic.Bool, panics *contain.Reporter, client string) (*Upload, error) {
	u.ResetRead()
	// The response header timeout runs from the end of the request, body
	// included, as http.Transport's does: an upload may take longer.
	if out.Body == nil {
		err := h1.WriteRequest(u.BW, out)
		if err == nil {
			err = u.BW.Flush()
		}
		if err != nil {
			return nil, ErrStaleWrite
		}
		u.Hdr.Begin()
		return nil, nil
	}
	up := &Upload{done: make(chan error, 1)}
	go func() {
		// The body is the guest's bytes, read through the h1 guard: a
		// panic here would otherwise end the daemon. The request is then a
		// cut one (not relayed), and its body closed early, so the guest's
		// connection ends after it.
		defer func() {
			if v := recover(); v != nil {
				panics.Report("http request body", v, "client", client)
				if cut != nil {
					cut.Store(true)
				}
				out.Body.Close()
				u.Close()
				up.done <- ErrUploadPanic
			}
		}()
		err := out.Write(u.BW)
		if err == nil {
			err = u.BW.Flush()
		}
		if err == nil {
			up.mu.Lock()
			if !up.hdrDone {
				u.Hdr.Begin()
			}
			up.mu.Unlock()
		} else if cut != nil && cut.Load() {
			// The body broke: the request can never be complete, so the
			// origin's answer is not waited for.
			u.Close()
		}
		up.done <- err
	}()
	return up, nil
}

// ReadResponse reads the answer to out, which Send sent with up and cut:
// informational answers (1xx but 100 Continue and 101) go to info, the
// final header is returned with its body to read. Its errors: ctx's when
// ctx ended, ErrBodyCut, ErrResponseHeaderTimeout, ErrStaleRead when the
// origin closed before sending a byte, a 101 (never asked for), or the
// read's.
func (u *Conn) ReadResponse(ctx context.Context, out *http.Request, up *Upload, cut *atomic.Bool, info func(*http.Response)) (*http.Response, error) {
	u.LimitHeader()
	resp, err := http.ReadResponse(u.BR, out)
	for err == nil && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		// The guest's own server answers 100-continue.
		if resp.StatusCode != http.StatusContinue {
			info(resp)
		}
		resp, err = http.ReadResponse(u.BR, out)
	}
	u.EndHeader()
	if up != nil {
		up.mu.Lock()
		up.hdrDone = true
		u.Hdr.End()
		up.mu.Unlock()
	} else {
		u.Hdr.End()
	}
	if cut != nil && cut.Load() {
		// The sender cut its body: the upload closed this connection, and
		// an answer read now may be the origin's to the truncated request
		// (a TLS close sends close_notify before the socket closes, and a
		// quick origin answers in between). It is not the guest's.
		return nil, ErrBodyCut
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if u.Hdr.Expired() {
			return nil, ErrResponseHeaderTimeout
		}
		if u.BytesRead() == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err)) {
			return nil, ErrStaleRead
		}
		return nil, err
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return nil, errors.New("reading upstream response: 101 Switching Protocols to a request without Upgrade")
	}
	return resp, nil
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
