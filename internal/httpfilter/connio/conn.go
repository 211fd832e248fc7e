package connio

import (
	"bufio"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/contain"
)

// IdleConn closes itself when no byte has moved in either direction for
// idle. It replaces absolute deadlines: a download of any size or duration
// lives as long as it keeps moving. Close runs onClose exactly once.
//
// Reads and writes only count bytes (no clock read per call): a timer looks
// at the counts every idle/idleChecks, and the connection closes once they
// have not changed for idle since the check that last saw them move. So a
// connection closes after at least idle of silence and at most
// idle*(1+1/idleChecks) plus the timer's own delay.
type IdleConn struct {
	net.Conn
	idle    time.Duration
	timer   atomic.Pointer[time.Timer] // set before it is armed: check always finds it
	once    sync.Once
	onClose func()
	rx, tx  atomic.Int64 // bytes read from and written to the peer
	// The timer's own state (only check touches it).
	seen  int64     // rx+tx at the last check
	moved time.Time // when a check last saw the counts change
}

// idleChecks is how many times per idle period an IdleConn looks at its
// byte counts.
const idleChecks = 4

// NewIdleConn wraps c: it closes after idle without a byte moving (never
// when idle is 0), and onClose (may be nil) runs once when it closes.
func NewIdleConn(c net.Conn, idle time.Duration, onClose func()) *IdleConn {
	ic := &IdleConn{Conn: c, idle: idle, onClose: onClose, moved: time.Now()}
	if idle > 0 {
		t := time.AfterFunc(math.MaxInt64, ic.check)
		ic.timer.Store(t)
		t.Reset(idle / idleChecks)
	}
	return ic
}

// Received is how many bytes were read from the peer so far.
func (c *IdleConn) Received() int64 { return c.rx.Load() }

// Sent is how many bytes were written to the peer so far.
func (c *IdleConn) Sent() int64 { return c.tx.Load() }

func (c *IdleConn) check() {
	now := time.Now()
	if n := c.rx.Load() + c.tx.Load(); n != c.seen {
		c.seen, c.moved = n, now
	} else if now.Sub(c.moved) >= c.idle {
		c.Close()
		return
	}
	c.timer.Load().Reset(c.idle / idleChecks)
}

func (c *IdleConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.rx.Add(int64(n))
	}
	return n, err
}

func (c *IdleConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.tx.Add(int64(n))
	}
	return n, err
}

func (c *IdleConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		if t := c.timer.Load(); t != nil {
			t.Stop()
		}
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// CloseWrite half-closes when the underlying connection can.
func (c *IdleConn) CloseWrite() error { return closeWrite(c.Conn) }

// prefixConn replays bytes already read (by a bufio.Reader or a ClientHello
// peek) before reading from the connection again.
type prefixConn struct {
	net.Conn
	r io.Reader
}

// WithPrefix returns c with prefix read before its own bytes.
func WithPrefix(c net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		return c
	}
	return &prefixConn{Conn: c, r: io.MultiReader(bytesReader(prefix), c)}
}

// WithBuffered returns c with what br holds of it read first.
func WithBuffered(c net.Conn, br *bufio.Reader) net.Conn {
	if br == nil || br.Buffered() == 0 {
		return c
	}
	b, _ := br.Peek(br.Buffered())
	return WithPrefix(c, append([]byte(nil), b...))
}

func (c *prefixConn) Read(b []byte) (int, error) { return c.r.Read(b) }

type byteReader struct{ b []byte }

func bytesReader(b []byte) io.Reader { return &byteReader{b} }

func (r *byteReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// Pipe copies both directions until either side ends, half-closing so
// protocols that shut down one direction first still work. It returns the
// bytes copied from a to b and from b to a. A panic in the second
// direction's goroutine closes both connections and is reported to
// panics; one in the first reaches the caller's goroutine.
func Pipe(a, b net.Conn, panics *contain.Reporter) (ab, ba int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			if v := recover(); v != nil {
				panics.Report("tunnel", v, "client", a.RemoteAddr().String())
				a.Close()
				b.Close()
			}
		}()
		ba = copyHalf(a, b)
	}()
	ab = copyHalf(b, a)
	wg.Wait()
	return ab, ba
}

const (
	smallBuf = 2 << 10
	bigBuf   = 64 << 10
	// bulkBuf is one read of a bulk transfer (a tunnel, a large plain
	// body, an intercepted one). Large reads and writes matter more than
	// the copy: on loopback, moving the bytes in 512 KiB pieces costs the
	// sending origin and the receiving client less CPU per byte than
	// splice(2) did, and the proxy's copy is cheaper than their extra work.
	bulkBuf = 512 << 10
)

// bulkBufs hold the pieces of bulk transfers; a buffer is taken while the
// transfer fills it and given back when it slows down or ends.
var bulkBufs = newBigPool(bulkBuf)

// maxBigBytes bounds the large buffers (bulkBufs, readBufs, coalesceBufs)
// the process holds at once. A guest that opens its connections' worth of
// downloads and stops reading would otherwise pin about 1 MiB of them per
// connection; past the budget transfers go on with ordinary buffers.
const maxBigBytes = 64 << 20

var bigBytesInUse atomic.Int64

// bigPool is a pool of large buffers taken under maxBigBytes.
type bigPool struct {
	pool sync.Pool
	size int64
}

func newBigPool(size int) *bigPool {
	p := &bigPool{size: int64(size)}
	p.pool.New = func() any { b := make([]byte, size); return &b }
	return p
}

// get returns a buffer, or nil when the budget is spent.
func (p *bigPool) get() *[]byte {
	if bigBytesInUse.Add(p.size) > maxBigBytes {
		bigBytesInUse.Add(-p.size)
		return nil
	}
	return p.pool.Get().(*[]byte)
}

func (p *bigPool) put(b *[]byte) {
	p.pool.Put(b)
	bigBytesInUse.Add(-p.size)
}

// BulkOrCopyBuf returns a bulk buffer, or an ordinary one when the budget
// is spent, and the function that gives it back.
func BulkOrCopyBuf() ([]byte, func()) {
	if b := bulkBufs.get(); b != nil {
		return *b, func() { bulkBufs.put(b) }
	}
	b := copyBufs.Get().(*[]byte)
	return *b, func() { copyBufs.Put(b) }
}

// copyHalf copies src to dst, then half-closes dst. An idle tunnel should
// cost little, so a direction starts with a small buffer; while reads fill
// it (a bulk transfer) the bytes go through a large pooled one (bulkBufs),
// and back to the small buffer as soon as the flow slows down. Every byte
// passes through both IdleConns' Read and Write, which keep the idle
// timeout and the byte counts, and through the guest connection's guard.
func copyHalf(dst, src net.Conn) int64 {
	small := make([]byte, smallBuf)
	buf := small
	var big *[]byte
	defer func() {
		if big != nil {
			bulkBufs.put(big)
		}
	}()
	var total int64
	var err error
	for {
		var n int
		n, err = src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			total += int64(w)
			if werr != nil {
				err = werr
				break
			}
		}
		if err != nil {
			break
		}
		switch {
		case big == nil && n == len(buf):
			if big = bulkBufs.get(); big != nil {
				buf = *big
			}
		case big != nil && n < smallBuf:
			bulkBufs.put(big)
			big, buf = nil, small
		}
	}
	if err == io.EOF {
		err = nil
	}
	if err != nil || closeWrite(dst) != nil {
		dst.Close()
		src.Close()
	}
	return total
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

func (g *H1Guard) CloseWrite() error    { return closeWrite(g.Conn) }
func (c *prefixConn) CloseWrite() error { return closeWrite(c.Conn) }
