package httpfilter

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// Reason codes of the ClientHello checks of byte tunnels.
const (
	// ReasonECH: the ClientHello carries Encrypted Client Hello or ESNI, so
	// its readable server name need not be the one the tunnel reaches.
	ReasonECH = "encrypted_client_hello"
	// ReasonHelloRetryChanged: the second ClientHello after a
	// HelloRetryRequest names another server than the first.
	ReasonHelloRetryChanged = "hello_retry_changed"
	// ReasonHelloTrailing: the records of the ClientHello carry more
	// handshake bytes than the hello (another hello packed behind it),
	// which no client sends and no check would see.
	ReasonHelloTrailing = "client_hello_trailing_data"
)

// errHelloTrailing: the ClientHello's records hold more than the hello.
var errHelloTrailing = errors.New("client hello records carry further handshake data")

// helloSpan returns how many bytes of buf the TLS records holding its first
// handshake message (the ClientHello) take, and whether those records hold
// that message and nothing more. buf starts with the first record.
func helloSpan(buf []byte) (n int, clean bool) {
	var hs []byte
	for n+recordHeaderLen <= len(buf) && buf[n] == recordHandshake {
		end := n + recordHeaderLen + (int(buf[n+3])<<8 | int(buf[n+4]))
		if end > len(buf) {
			break
		}
		hs = append(hs, buf[n+recordHeaderLen:end]...)
		n = end
		if len(hs) >= 4 {
			if msg := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])); len(hs) >= msg {
				return n, len(hs) == msg
			}
		}
	}
	return n, false
}

// TLS extension code points that hide or replace the server name: ECH
// (RFC 9849), its outer-extensions compression, and draft ESNI (0xffce).
const (
	extECH          = 0xfe0d
	extECHOuter     = 0xfd00
	extESNI         = 0xffce
	recordHandshake = 22
	recordCCS       = 20
	recordAppData   = 23
	// maxEarlyBytes bounds the records relayed ahead of a retried hello.
	maxEarlyBytes   = 64 << 10
	recordHeaderLen = 5
	maxRecordLen    = 16384 + 2048
)

// helloRetryRandom is the ServerHello.random that marks a HelloRetryRequest
// (RFC 8446, 4.1.3).
var helloRetryRandom = []byte{
	0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11, 0xbe, 0x1d, 0x8c, 0x02, 0x1e, 0x65, 0xb8, 0x91,
	0xc2, 0xa2, 0x11, 0x16, 0x7a, 0xbb, 0x8c, 0x5e, 0x07, 0x9e, 0x09, 0xe2, 0xc8, 0xa8, 0x33, 0x9c,
}

// helloRefusal is the reason a byte tunnel refuses a ClientHello for t, or
// "": the readable server name must be the CONNECT host, and nothing may
// carry another one out of sight (ECH, ESNI). GREASE ECH (Chrome sends it
// to every server) cannot be told from the real thing, so it is refused
// too: such clients work with interception, not with --no-mitm.
func helloRefusal(h *tls.ClientHelloInfo, t egress.Target) string {
	for _, ext := range h.Extensions {
		switch ext {
		case extECH, extECHOuter, extESNI:
			return ReasonECH
		}
	}
	switch {
	case h.ServerName == "":
		return ReasonSNIMissing
	case !sniMatches(h.ServerName, t):
		return ReasonSNIMismatch
	}
	return ""
}

// helloAccepted reports whether a byte tunnel may relay the ClientHello h
// (read with err) for t; if not, rec says why.
func helloAccepted(rec *record, h *tls.ClientHelloInfo, err error, t egress.Target) bool {
	if err != nil {
		rec.verdict, rec.reason, rec.err = allowlist.Block, ReasonNotTLS, err
		if errors.Is(err, errHelloTrailing) {
			rec.reason = ReasonHelloTrailing
		}
		return false
	}
	if reason := helloRefusal(h, t); reason != "" {
		rec.verdict, rec.reason, rec.sni = allowlist.Block, reason, h.ServerName
		return false
	}
	return true
}

// readRecord reads one TLS record from c, returning it whole.
func readRecord(c io.Reader) ([]byte, error) {
	hdr := make([]byte, recordHeaderLen, recordHeaderLen+512)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return nil, err
	}
	n := int(hdr[3])<<8 | int(hdr[4])
	if n > maxRecordLen {
		return nil, fmt.Errorf("tls record of %d bytes", n)
	}
	rec := append(hdr, make([]byte, n)...)
	if _, err := io.ReadFull(c, rec[recordHeaderLen:]); err != nil {
		return nil, err
	}
	return rec, nil
}

// readServerHello reads the upstream's first records until the start of its
// first handshake message is known. It returns the bytes read (to be
// relayed) and whether that message is a HelloRetryRequest. Anything that
// is not a handshake record (an alert) ends the look.
func readServerHello(up io.Reader) (raw []byte, hrr bool, err error) {
	var hs []byte
	for len(hs) < 4+2+32 {
		rec, err := readRecord(up)
		raw = append(raw, rec...)
		if err != nil {
			return raw, false, err
		}
		if rec[0] != recordHandshake {
			return raw, false, nil
		}
		hs = append(hs, rec[recordHeaderLen:]...)
	}
	const serverHello = 2
	return raw, hs[0] == serverHello && bytes.Equal(hs[6:38], helloRetryRandom), nil
}

// secondHello reads the client's answer to a HelloRetryRequest: optional
// ChangeCipherSpec records (middlebox compatibility) and early data, then
// the second ClientHello. It returns the bytes to relay and the parsed hello.
func secondHello(client net.Conn) (*tls.ClientHelloInfo, []byte, net.Conn, error) {
	var ccs []byte
	for {
		hdr := make([]byte, 1)
		if _, err := io.ReadFull(client, hdr); err != nil {
			return nil, ccs, client, err
		}
		// Besides ChangeCipherSpec, the 0-RTT data a client sent behind
		// its first hello (relayed after the origin's first answer, as all
		// bytes behind a hello are), which a server that asked for a retry
		// skips (RFC 8446 4.2.10).
		if hdr[0] != recordCCS && hdr[0] != recordAppData {
			client = connio.WithPrefix(client, hdr)
			break
		}
		rec, err := readRecord(connio.WithPrefix(client, hdr))
		ccs = append(ccs, rec...)
		if err != nil {
			return nil, ccs, client, err
		}
		if len(ccs) > maxEarlyBytes {
			return nil, ccs, client, errors.New("change cipher spec and early data records instead of a client hello")
		}
	}
	hello, raw, client, err := peekClientHello(client)
	return hello, append(ccs, raw...), client, err
}

// sameServer reports whether a retried ClientHello names the same server in
// the same way as the first.
func sameServer(a, b *tls.ClientHelloInfo) bool {
	return a.ServerName == b.ServerName && slices.Equal(a.SupportedProtos, b.SupportedProtos)
}
