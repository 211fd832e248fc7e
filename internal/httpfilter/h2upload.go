package httpfilter

import (
	"io"
	"net/http"
	"time"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// Bounds of what the proxy takes of an upload the origin no longer reads.
const (
	uploadRestMax  = 256 << 10
	uploadRestTime = 2 * time.Second
)

// An origin may answer an HTTP/2 request before reading its body (a
// refusal, or a handler that ignores it). The upstream transport then
// closes the body it was sending; were that the guest's stream body, the
// proxy's HTTP/2 server would reset the stream under the guest's upload
// (STREAM_CLOSED, or NO_ERROR once the handler returns, as RFC 9113 8.1
// allows), and curl 7.88 reports a framing error instead of the complete
// response. So an HTTP/2 stream's body reaches the upstream through an
// uploadRelay: when the upstream is done with it, the relay takes the rest
// of the guest's upload, up to uploadRestMax bytes or uploadRestTime, and
// finishUpload waits for that before the stream ends, which then ends
// with the guest's own END_STREAM. Net/http's HTTP/1 server drains an
// unread body the same way.
type uploadRelay struct {
	pr   *io.PipeReader
	done chan struct{}
}

// relayUpload returns the body the upstream is to read for r: r.Body
// itself, or for an HTTP/2 stream (without Expect: the guest then waits
// for a 100 before it sends) an uploadRelay over it.
func relayUpload(r *http.Request) io.ReadCloser {
	if r.ProtoMajor != 2 || r.Header.Get("Expect") != "" {
		return r.Body
	}
	pr, pw := io.Pipe()
	u := &uploadRelay{pr: pr, done: make(chan struct{})}
	go u.run(r.Body, pw)
	return u
}

func (u *uploadRelay) run(guest io.ReadCloser, pw *io.PipeWriter) {
	defer close(u.done)
	bp := connio.CopyBuf()
	defer connio.PutCopyBuf(bp)
	buf := *bp
	for {
		n, err := guest.Read(buf)
		if n > 0 {
			if _, werr := pw.Write(buf[:n]); werr != nil {
				// The upstream is done with the body: take the rest.
				t := time.AfterFunc(uploadRestTime, func() { guest.Close() })
				io.CopyN(io.Discard, guest, uploadRestMax)
				t.Stop()
				return
			}
		}
		if err != nil {
			pw.CloseWithError(err) // io.EOF: the reader's EOF
			return
		}
	}
}

func (u *uploadRelay) Read(p []byte) (int, error) { return u.pr.Read(p) }

// Close is the upstream's: it stops the relay, which then takes the rest.
func (u *uploadRelay) Close() error { return u.pr.Close() }

// finishUpload waits, once the response is complete, for the relay of r's
// body (if any) to have taken the guest's upload: see uploadRelay.
func finishUpload(w http.ResponseWriter, r *http.Request) {
	cb, ok := guestBody(r.Body)
	if !ok {
		return
	}
	u, ok := cb.ReadCloser.(*uploadRelay)
	if !ok {
		return
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	u.Close()
	select {
	case <-u.done:
	case <-time.After(uploadRestTime + time.Second):
	}
}
