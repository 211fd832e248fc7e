// Package connio is the proxy's connection plumbing: connections that close
// themselves when idle and count their bytes (IdleConn), replaying bytes
// already read (WithPrefix, WithBuffered), the two-way copy of a tunnel
// (Pipe), pooled buffers under one budget for large ones, TLS write
// coalescing and large ciphertext reads (NewCoalescedServer, ReadBuf), the
// guest sockets' options (TuneGuestConn) and the HTTP/1 framing guard that
// sits under every guest connection (H1Guard).
//
// It moves and checks bytes and knows no policy: it imports no policy
// package and not httpfilter (layering_test.go holds that). What may pass
// is decided in internal/httpfilter.
package connio

import "sync"

// Reason codes of the refusals made here, written as X-Abox-Reason and in
// the decision log; internal/httpfilter re-exports them under the same names.
const (
	ReasonURITooLong    = "uri_too_long"
	ReasonFieldTooLarge = "header_field_too_large"
	ReasonMissingHost   = "missing_host"
	ReasonMalformedHost = "malformed_host"
)

var copyBufs = sync.Pool{New: func() any { b := make([]byte, bigBuf); return &b }}

// CopyBuf takes an ordinary copy buffer (64 KiB) from the pool; give it
// back with PutCopyBuf.
func CopyBuf() *[]byte { return copyBufs.Get().(*[]byte) }

// PutCopyBuf gives back a buffer from CopyBuf.
func PutCopyBuf(b *[]byte) { copyBufs.Put(b) }

// BufferPool is an httputil.BufferPool over the ordinary copy buffers.
type BufferPool struct{}

// Get takes a buffer.
func (BufferPool) Get() []byte { return *copyBufs.Get().(*[]byte) }

// Put gives b back.
func (BufferPool) Put(b []byte) { copyBufs.Put(&b) }
