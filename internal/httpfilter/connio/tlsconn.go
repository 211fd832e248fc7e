package connio

import (
	"crypto/tls"
	"net"
	"sync"
)

// The TLS layers of the proxy move bulk data in 16 KiB records, and
// crypto/tls hands each record to its connection in a write of its own and
// reads ciphertext in pieces about as large. The types here sit under
// tls.Conn and batch those system calls without holding bytes back:
// coalescer gathers the records of one tls.Conn.Write into one write, and
// ReadBuf reads ciphertext in large reads while the peer keeps sending.

// coalesceMin is the smallest plaintext write worth gathering: smaller ones
// fit one record.
const coalesceMin = 2 << 10

// coalesceBuf bounds what a coalescer gathers before it writes.
const coalesceBuf = 256<<10 + 4<<10

var coalesceBufs = newBigPool(coalesceBuf)

// coalescer is the connection under a tls.Conn. While an outer Write is in
// progress (armed) the records it produces are gathered and written at
// once; every other write (handshake, alerts, post-handshake messages) goes
// straight through. Every end of an outer Write flushes, so no byte is held
// once a Write has returned. A failed write is sticky: later writes fail
// too, as the tls.Conn above would.
type coalescer struct {
	net.Conn
	mu    sync.Mutex
	armed int
	buf   *[]byte // pooled while bytes are gathered
	err   error
}

func (c *coalescer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.armed == 0 {
		return c.writeLocked(p)
	}
	if c.buf != nil && len(*c.buf)+len(p) > cap(*c.buf) {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) > coalesceBuf {
		return c.writeLocked(p)
	}
	if c.buf == nil {
		if c.buf = coalesceBufs.get(); c.buf == nil {
			return c.writeLocked(p) // over the budget: no gathering
		}
		*c.buf = (*c.buf)[:0]
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

func (c *coalescer) writeLocked(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// flushLocked writes what was gathered and gives the buffer back.
func (c *coalescer) flushLocked() error {
	if c.buf == nil {
		return c.err
	}
	b := c.buf
	c.buf = nil
	var err error
	if len(*b) > 0 && c.err == nil {
		_, err = c.writeLocked(*b)
	}
	coalesceBufs.put(b)
	if err == nil {
		err = c.err
	}
	return err
}

func (c *coalescer) arm() {
	c.mu.Lock()
	c.armed++
	c.mu.Unlock()
}

// disarm ends one outer Write: everything gathered so far is written.
func (c *coalescer) disarm() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed--
	return c.flushLocked()
}

// held reports how many bytes are gathered and not yet written (tests).
func (c *coalescer) held() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		return 0
	}
	return len(*c.buf)
}

// FlushConn is a tls.Conn over a coalescer: a Write large enough to take
// several records is gathered into one write of the connection below.
type FlushConn struct {
	*tls.Conn
	co *coalescer
}

// NewCoalescedServer is tls.Server with its records gathered per Write.
func NewCoalescedServer(c net.Conn, cfg *tls.Config) *FlushConn {
	co := &coalescer{Conn: c}
	return &FlushConn{Conn: tls.Server(co, cfg), co: co}
}

func (c *FlushConn) Write(b []byte) (int, error) {
	if len(b) < coalesceMin {
		return c.Conn.Write(b)
	}
	c.co.arm()
	n, err := c.Conn.Write(b)
	if ferr := c.co.disarm(); ferr != nil && err == nil {
		// The records were accepted but not sent: none of b is known to
		// have reached the peer.
		return 0, ferr
	}
	return n, err
}

// Limits of ReadBuf.
const (
	// readBufSize is one large read of ciphertext.
	readBufSize = 256 << 10
	// readBufKeep: a fill at least this large keeps the buffer for the
	// next one; a smaller one gives it back once drained, so an idle or
	// slow connection holds none.
	readBufKeep = 32 << 10
	// maxTLSRecord is the largest TLS record on the wire (header, 2^14
	// bytes of plaintext and the largest expansion a cipher may add).
	maxTLSRecord = 5 + 16<<10 + 256
)

var readBufs = newBigPool(readBufSize)

// ReadBuf is the connection under an upstream tls.Conn. It passes reads
// through until one fills the reader's buffer (the peer is sending in
// bulk); from then on it reads up to readBufSize at once and serves the
// reader from that, until a fill comes back small. It never reads ahead
// of what the reader asked for while it holds nothing.
type ReadBuf struct {
	net.Conn
	big  *[]byte
	r, w int
	keep bool // the last fill was large: refill into the same buffer
}

// NewReadBuf returns the reader to put under an upstream tls.Conn over c.
func NewReadBuf(c net.Conn) *ReadBuf { return &ReadBuf{Conn: c} }

func (c *ReadBuf) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.r < c.w {
		return c.serve(p), nil
	}
	if c.big == nil {
		n, err := c.Conn.Read(p)
		if n == len(p) && n >= 1<<10 {
			c.big, c.keep = readBufs.get(), true
		}
		return n, err
	}
	n, err := c.Conn.Read(*c.big)
	c.r, c.w, c.keep = 0, n, n >= readBufKeep
	if n == 0 {
		c.release()
		return 0, err
	}
	// An error after bytes is seen again by the next read.
	return c.serve(p), nil
}

func (c *ReadBuf) serve(p []byte) int {
	n := copy(p, (*c.big)[c.r:c.w])
	c.r += n
	if c.r == c.w && !c.keep {
		c.release()
	}
	return n
}

func (c *ReadBuf) release() {
	if c.big != nil {
		readBufs.put(c.big)
		c.big, c.r, c.w = nil, 0, 0
	}
}

// Idle gives the buffer back when nothing is held in it (the connection
// goes back to the pool).
func (c *ReadBuf) Idle() {
	if c.r == c.w {
		c.release()
	}
}

// RecordReady reports whether a whole TLS record is held, so the tls.Conn
// above can produce its next plaintext without waiting on the network.
func (c *ReadBuf) RecordReady() bool { return c.w-c.r >= maxTLSRecord }
