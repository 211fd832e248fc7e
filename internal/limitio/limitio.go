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

// Tail keeps the last Max bytes written to it (the end of a failing
// command's output says why it failed) and counts the rest: memory stays
// bounded however long the writer goes on.
type Tail struct {
	Max   int
	b     []byte
	total int64
}

// Write keeps the last Max bytes of everything written so far.
func (t *Tail) Write(p []byte) (int, error) {
	t.total += int64(len(p))
	if len(p) >= t.Max {
		t.b = append(t.b[:0], p[len(p)-t.Max:]...)
		return len(p), nil
	}
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.Max {
		// Amortised: the kept tail moves once per Max bytes written.
		t.b = append(t.b[:0], t.b[len(t.b)-t.Max:]...)
	}
	return len(p), nil
}

// String is the kept tail, "…" first when something was cut.
func (t *Tail) String() string {
	b := t.b
	if len(b) > t.Max {
		b = b[len(b)-t.Max:]
	}
	if t.total > int64(len(b)) {
		return "…" + string(b)
	}
	return string(b)
}
