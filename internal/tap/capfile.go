package tap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// DefaultMaxBytes is the capture file's cap when none is given: a guest
// can send at line rate, and the file is on the host's disk.
const DefaultMaxBytes = 1000 * 1000 * 1000

// ErrCapReached means the capture file reached Options.MaxBytes and the
// capture was stopped there.
var ErrCapReached = errors.New("the capture file reached its size cap")

const (
	pcapHeaderLen   = 24
	pcapRecordLen   = 16
	maxPcapRecord   = 1 << 18 // tcpdump's largest snapshot length
	pcapMagicMicros = 0xa1b2c3d4
	pcapMagicNanos  = 0xa1b23c4d
)

// capFile takes tcpdump's pcap stream (-w -) and writes it to the capture
// file whole packets at a time, so that the file stays a valid capture
// when it is cut: at the cap (max bytes, header included; 0 is none),
// or when a write fails (a full disk), after which the file is truncated
// back to the last whole packet. Either closes stop, so that Run ends
// tcpdump; what tcpdump still sends is read and dropped, so it can exit.
//
// With a ring (next set), the packet that would pass the cap starts the
// next file instead, which next opens empty, and the stream's header is
// written again at its start: files 0, 1, …, n-1, then 0 again.
type capFile struct {
	f    sink
	max  int64
	stop chan struct{}
	// nextFile opens the ring's next file and reports its number; nil
	// without a ring.
	nextFile func() (sink, int, error)

	mu      sync.Mutex
	order   binary.ByteOrder // nil until the header is read
	pending []byte           // bytes of a header or packet not yet whole
	written int64            // bytes in the file, a packet boundary
	packets int
	err     error // why the capture was cut (ErrCapReached, a write error)
	once    sync.Once
	hdr     []byte // the stream's header, for each file of a ring
	file    int    // the ring's file being written
}

// sink is the capture file: an *os.File.
type sink interface {
	Write([]byte) (int, error)
	Truncate(size int64) error
	Close() error
}

func newCapFile(f sink, max int64) *capFile {
	return &capFile{f: f, max: max, stop: make(chan struct{})}
}

func (c *capFile) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return len(b), nil
	}
	c.pending = append(c.pending, b...)
	for c.err == nil {
		n, err := c.next()
		if err != nil {
			c.cut(err)
			break
		}
		if n == 0 {
			break
		}
		if !c.put(c.pending[:n]) {
			break
		}
		c.pending = c.pending[n:]
	}
	if len(c.pending) == 0 {
		c.pending = nil // let the buffer go between packets
	}
	return len(b), nil
}

// next returns the length of the whole header or packet at the start of
// pending, or 0 if it is not all there yet.
func (c *capFile) next() (int, error) {
	if c.order == nil {
		if len(c.pending) < pcapHeaderLen {
			return 0, nil
		}
		switch m := c.pending[:4]; {
		case binary.LittleEndian.Uint32(m) == pcapMagicMicros || binary.LittleEndian.Uint32(m) == pcapMagicNanos:
			c.order = binary.LittleEndian
		case binary.BigEndian.Uint32(m) == pcapMagicMicros || binary.BigEndian.Uint32(m) == pcapMagicNanos:
			c.order = binary.BigEndian
		default:
			return 0, fmt.Errorf("tcpdump's output is not a pcap stream (magic %x)", m)
		}
		return pcapHeaderLen, nil
	}
	if len(c.pending) < pcapRecordLen {
		return 0, nil
	}
	n := c.order.Uint32(c.pending[8:12])
	if n > maxPcapRecord {
		return 0, fmt.Errorf("tcpdump's output holds a packet record of %d bytes", n)
	}
	if len(c.pending) < pcapRecordLen+int(n) {
		return 0, nil
	}
	return pcapRecordLen + int(n), nil
}

// put appends one header or packet, unless that would pass the cap; it
// reports whether it did.
func (c *capFile) put(rec []byte) bool {
	packet := c.hdr != nil
	if c.max > 0 && c.written+int64(len(rec)) > c.max {
		if c.nextFile == nil || !packet || int64(len(c.hdr)+len(rec)) > c.max {
			c.cut(ErrCapReached)
			return false
		}
		if !c.rotate() {
			return false
		}
	}
	if _, err := c.f.Write(rec); err != nil {
		// A short write leaves part of a packet behind: cut it off.
		if terr := c.f.Truncate(c.written); terr != nil {
			err = errors.Join(err, terr)
		}
		c.cut(fmt.Errorf("writing the capture file: %w", err))
		return false
	}
	c.written += int64(len(rec))
	if packet {
		c.packets++
	} else {
		c.hdr = bytes.Clone(rec)
	}
	return true
}

// rotate closes the file and starts the ring's next one with the header.
func (c *capFile) rotate() bool {
	err := c.f.Close()
	var f sink
	n := c.file
	if err == nil {
		f, n, err = c.nextFile()
	}
	if err == nil {
		c.f, c.file = f, n
		_, err = c.f.Write(c.hdr)
	}
	if err != nil {
		c.cut(fmt.Errorf("starting capture file %d of the ring: %w", n, err))
		return false
	}
	c.written = int64(len(c.hdr))
	return true
}

// close closes the file being written.
func (c *capFile) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.f.Close()
}

func (c *capFile) cut(err error) {
	c.err = err
	c.pending = nil
	c.once.Do(func() { close(c.stop) })
}

// result is the packets the file holds, its size, and why the capture was
// cut (nil if it was not).
func (c *capFile) result() (packets int, size int64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.packets, c.written, c.err
}
