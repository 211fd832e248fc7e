// Package h1client is the client side of the proxy's HTTP engine: the
// HTTP/1.1 connections to origins (Conn, opened by Open, which hands back a
// shared HTTP/2 connection instead when the origin picks it), one exchange
// on a Conn (Send, ReadResponse, Retryable) and the pool that keeps both
// kinds of connection between requests (Pool).
//
// It knows no policy: the pool is keyed and swept by values the policy
// chooses (internal/httpfilter keys by the checked address, and tags each
// connection with the target it was opened for), and the connection is
// dialled by the caller. It imports no policy package and not httpfilter
// (internal/httpfilter/layering_test.go holds that); it may import h1 and
// connio.
package h1client

import "time"

// Limits of the pool and of a response.
const (
	// IdleTimeout closes a pooled connection nobody used for this long.
	IdleTimeout = 90 * time.Second
	// MaxIdlePerKey and MaxIdle bound the idle HTTP/1.1 connections kept
	// per key and in all.
	MaxIdlePerKey = 64
	MaxIdle       = 512
	// MaxH2 bounds the shared HTTP/2 connections kept: at the bound a new
	// one takes the place of the one idle longest. Each key (address,
	// host) has its own, kept IdleTimeout after its last stream: without a
	// bound, a guest asking for new names under an allowlisted wildcard
	// (its DNS rate, 200 a second) would have the proxy hold some 18,000
	// connections, their file descriptors (the process's limit) and a GiB
	// of memory. Busy connections are never closed for it: the caller
	// bounds the requests forwarded at once.
	MaxH2 = 256
	// MaxResponseHeader bounds an upstream response header block.
	MaxResponseHeader = 1 << 20

	readBuf  = 8 << 10
	writeBuf = 4 << 10
)
