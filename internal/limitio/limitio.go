// Package limitio bounds what the host keeps of output someone else
// controls (a guest answering a probe can answer without end).
package limitio

import "errors"

// ErrTooLarge is a write past a failing Buffer's bound.
var ErrTooLarge = errors.New("output too large")

// Buffer keeps at most Max bytes. With Fail, a write past Max fails with
// ErrTooLarge (os/exec then closes the pipe, and the writer dies of
// SIGPIPE); without, the rest is accepted and dropped.
type Buffer struct {
	Max  int
	Fail bool
	b    []byte
	over bool
}

// Write keeps what fits.
func (c *Buffer) Write(p []byte) (int, error) {
	room := max(c.Max-len(c.b), 0)
	if len(p) <= room {
		c.b = append(c.b, p...)
		return len(p), nil
	}
	c.b = append(c.b, p[:room]...)
	c.over = true
	if c.Fail {
		return room, ErrTooLarge
	}
	return len(p), nil
}

// Bytes is what was kept.
func (c *Buffer) Bytes() []byte { return c.b }

// Over reports whether more than Max bytes were written.
func (c *Buffer) Over() bool { return c.over }
