package connio

import (
	"io"
	"net"
)

// BulkMin is the smallest plain-HTTP response body relayed straight between
// the two connections.
const BulkMin = 64 << 10

// RawBody is the rest of a plain-HTTP response body of known length: n
// bytes still to come from the upstream connection src, nothing of them
// buffered. The guest's connection copies it through a large buffer
// (H1Guard.ReadFrom); anyone else reads it.
type RawBody struct {
	src *IdleConn
	n   int64
}

// NewRawBody is the n bytes still to come from src, nothing of them
// buffered.
func NewRawBody(src *IdleConn, n int64) *RawBody { return &RawBody{src: src, n: n} }

// Remaining is how many of its bytes have not been read.
func (b *RawBody) Remaining() int64 { return b.n }

func (b *RawBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.src.Read(p)
	b.n -= int64(n)
	if err == io.EOF && b.n > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// ReadFrom lets net/http's response writer hand a RawBody to the guest's
// connection: it is copied from the upstream socket to the guest's through a
// pooled bulkBufs buffer, under the guard's write lock, so a refusal of a
// pipelined request cannot interleave with it. Any other source is copied
// through Write.
func (g *H1Guard) ReadFrom(r io.Reader) (int64, error) {
	rb, ok := r.(*RawBody)
	if !ok {
		return CopyVia(g, r)
	}
	g.wmu.Lock()
	defer g.wmu.Unlock()
	if g.rejected {
		return 0, net.ErrClosed
	}
	g.bulk.Add(1)
	return copyBulk(g.Conn, rb)
}

// CopyVia copies r to w through a pooled buffer, hiding w's ReadFrom.
func CopyVia(w io.Writer, r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{w}, r, *bp)
}

// copyBulk copies r to w through a pooled bulkBufs buffer.
func copyBulk(w io.Writer, r io.Reader) (int64, error) {
	buf, release := BulkOrCopyBuf()
	defer release()
	return io.CopyBuffer(struct{ io.Writer }{w}, struct{ io.Reader }{r}, buf)
}
