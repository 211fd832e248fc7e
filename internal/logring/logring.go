// Package logring keeps the most recent JSON log lines of a filter in memory
// so the local API can serve them without reading log files.
package logring

import (
	"bytes"
	"sync"
)

// Ring is an io.Writer that keeps the last N complete lines written to it.
// slog's JSON handler writes one whole line per call, which is what Ring expects.
type Ring struct {
	mu    sync.Mutex
	lines [][]byte // circular; len(lines) == capacity once full
	next  int
	full  bool
	// seq counts every line ever written so followers can ask "after n".
	seq uint64
}

// New returns a ring holding up to n lines (n < 1 means 1000).
func New(n int) *Ring {
	if n < 1 {
		n = 1000
	}
	return &Ring{lines: make([][]byte, n)}
}

// maxKept bounds the storage a slot keeps for reuse after a long line.
const maxKept = 4 << 10

// Write stores p, split into lines; it never fails. Each line is copied
// into the storage of the line it replaces (a filter writes lines by the
// hundred thousand a second; readers get copies), so a full ring writes
// without allocating.
func (r *Ring) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for rest := p; len(rest) > 0; {
		l := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			l, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if len(l) == 0 {
			continue
		}
		slot := r.lines[r.next]
		if cap(slot) > maxKept && len(l) <= maxKept {
			slot = nil
		}
		r.lines[r.next] = append(slot[:0], l...)
		r.next = (r.next + 1) % len(r.lines)
		if r.next == 0 {
			r.full = true
		}
		r.seq++
	}
	return len(p), nil
}

// Last returns up to n of the most recent lines, oldest first, and the
// sequence number of the newest line.
func (r *Ring) Last(n int) ([][]byte, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastLocked(n), r.seq
}

// Since returns the lines written after sequence number seq (as many as are
// still held), oldest first, and the newest sequence number.
func (r *Ring) Since(seq uint64) ([][]byte, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq >= r.seq {
		return nil, r.seq
	}
	return r.lastLocked(int(min(r.seq-seq, uint64(len(r.lines))))), r.seq
}

func (r *Ring) lastLocked(n int) [][]byte {
	size := r.next
	if r.full {
		size = len(r.lines)
	}
	if n <= 0 || n > size {
		n = size
	}
	out := make([][]byte, 0, n)
	for i := size - n; i < size; i++ {
		idx := i
		if r.full {
			idx = (r.next + i) % len(r.lines)
		}
		out = append(out, bytes.Clone(r.lines[idx])) // the slot is reused
	}
	return out
}
