package httpfilter

import (
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// spliceMin is the smallest response body worth moving inside the kernel.
const spliceMin = 64 << 10

// spliceBody is the rest of a plain-HTTP response body of known length:
// n bytes still to come from the upstream connection src, nothing of them
// buffered. The guest's connection moves it with splice(2) when it can
// (h1Guard.ReadFrom); anyone else reads it.
type spliceBody struct {
	src *idleConn
	n   int64
}

func (b *spliceBody) Read(p []byte) (int, error) {
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

// ReadFrom lets net/http's response writer hand a spliceBody to the guest's
// TCP connection; any other source, or a connection that is not plain TCP
// or was refused, is copied through Write.
func (g *h1Guard) ReadFrom(r io.Reader) (int64, error) {
	if sb, ok := r.(*spliceBody); ok {
		if dt, di := rawTCP(g, false); dt != nil {
			if st, ok := sb.src.Conn.(*net.TCPConn); ok {
				g.wmu.Lock()
				n, err := spliceBodyTo(dt, di, st, sb)
				g.wmu.Unlock()
				if n > 0 {
					g.spliced.Add(1)
				}
				if err != nil || sb.n == 0 {
					return n, err
				}
				// The origin stalled: the rest goes through buffered reads,
				// so a slow body holds no pipe.
				m, err := copyVia(g, sb)
				return n + m, err
			}
		}
	}
	return copyVia(g, r)
}

func copyVia(w io.Writer, r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{w}, r, *bp)
}

// spliceBodyTo moves sb's bytes from st to dt in the kernel, in slices
// bounded by a read deadline as spliceHalf does, and accounts them on both
// idle connections. It returns when the body is done, on an error, or when
// a slice moved nothing (sb.n > 0, err nil).
func spliceBodyTo(dt *net.TCPConn, di *idleConn, st *net.TCPConn, sb *spliceBody) (int64, error) {
	slice := maxSpliceSlice
	for _, ic := range []*idleConn{di, sb.src} {
		if ic.idle > 0 {
			slice = min(slice, max(ic.idle/4, time.Millisecond))
		}
	}
	defer st.SetReadDeadline(time.Time{})
	var total int64
	for sb.n > 0 {
		if err := st.SetReadDeadline(time.Now().Add(slice)); err != nil {
			return total, err
		}
		lr := &io.LimitedReader{R: st, N: min(sb.n, spliceChunk)}
		want := lr.N
		n, err := dt.ReadFrom(lr)
		if n > 0 {
			total += n
			sb.n -= n
			sb.src.moved(n, 0)
			di.moved(0, n)
		}
		switch {
		case err != nil && errors.Is(err, os.ErrDeadlineExceeded):
			if n == 0 {
				return total, nil
			}
		case err != nil:
			return total, err
		case n < want:
			return total, io.ErrUnexpectedEOF // the origin closed early
		}
	}
	return total, nil
}
