package httpfilter

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// FuzzTunnelHello: whatever a guest sends into a byte tunnel (--no-mitm)
// after its CONNECT, every ClientHello an origin's TLS stack reads from
// the tunnel (the first, and the second after a HelloRetryRequest) names
// the CONNECT host and carries no ECH or ESNI: the bytes relayed are the
// hello the proxy checked, not another reading of them. An origin that
// reads anything before the first hello that is not a complete hello
// fails the target too.

// tunnelHost is the CONNECT target of FuzzTunnelHello.
const tunnelHost = "allowed.test"

// readHandshake reads TLS records from c until they hold one complete
// handshake message, as a TLS server does, and returns the records read
// and whether they hold more handshake bytes than that message.
func readHandshake(c io.Reader) (raw []byte, trailing bool, err error) {
	var hs []byte
	for {
		hdr := make([]byte, recordHeaderLen)
		if _, err := io.ReadFull(c, hdr); err != nil {
			if len(raw) == 0 && errors.Is(err, io.EOF) {
				return nil, false, io.EOF
			}
			return raw, false, fmt.Errorf("record header: %w", err)
		}
		body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
		if _, err := io.ReadFull(c, body); err != nil {
			return raw, false, fmt.Errorf("record body: %w", err)
		}
		raw = append(append(raw, hdr...), body...)
		if hdr[0] != recordHandshake {
			return raw, false, fmt.Errorf("record of type %d before the handshake message is complete", hdr[0])
		}
		hs = append(hs, body...)
		if len(hs) >= 4 {
			if n := 4 + (int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])); len(hs) >= n {
				return raw, len(hs) > n, nil
			}
		}
	}
}

// parseHello parses the records of a ClientHello as a TLS server does.
func parseHello(raw []byte) (*tls.ClientHelloInfo, error) {
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		b.Write(raw)
		b.Close()
	}()
	var hello *tls.ClientHelloInfo
	errSeen := errors.New("seen")
	err := tls.Server(&recordingConn{Conn: a}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = h
		return nil, errSeen
	}}).Handshake()
	if hello == nil {
		return nil, fmt.Errorf("no client hello: %w", err)
	}
	return hello, nil
}

// serveHellos is an origin's TLS server as far as the tunnel checks go:
// it reads the first ClientHello, answers with a ServerHello-shaped
// record (a HelloRetryRequest when hrr) and, after a retry request, skips
// ChangeCipherSpec and early data and reads the second ClientHello. Each
// hello is recorded, with its server name in host and "hello1"/"hello2"
// in method; the rest of the tunnel is read and dropped.
func (o *fuzzOrigins) serveHellos(c net.Conn, ap netip.AddrPort, hrr bool) {
	defer c.Close()
	defer io.Copy(io.Discard, c)
	for phase := 1; phase <= 2; phase++ {
		var raw []byte
		var trailing bool
		var err error
		for {
			raw, trailing, err = readHandshake(c)
			if phase == 1 || err == nil || len(raw) == 0 || (raw[0] != recordCCS && raw[0] != recordAppData) {
				break
			}
			// After a retry request: ChangeCipherSpec and 0-RTT data the
			// server skips, one record at a time.
			if int(raw[3])<<8|int(raw[4])+recordHeaderLen != len(raw) {
				break
			}
		}
		method := fmt.Sprintf("hello%d", phase)
		if errors.Is(err, io.EOF) {
			return
		}
		if err == nil && trailing {
			err = errors.New("the hello's records carry more handshake bytes")
		}
		var h *tls.ClientHelloInfo
		if err == nil {
			h, err = parseHello(raw)
		}
		if err != nil {
			o.record(originReq{dialed: ap, method: method, err: err})
			return
		}
		o.record(originReq{dialed: ap, method: method, host: h.ServerName, ext: h.Extensions})
		if phase == 2 {
			return
		}
		random := make([]byte, 32)
		if hrr {
			random = helloRetryRandom
		}
		sh := append([]byte{2, 0, 0, 38, 3, 3}, random...)
		if _, err := c.Write(append([]byte{recordHandshake, 3, 3, 0, byte(len(sh))}, sh...)); err != nil || !hrr {
			return
		}
	}
}

// withExtension returns the one-record ClientHello rec with an empty
// extension of type ext added at the end of its extensions.
func withExtension(t testing.TB, rec []byte, ext uint16) []byte {
	hs := rec[recordHeaderLen:]
	i := 4 + 2 + 32 // handshake header, version, random
	i += 1 + int(hs[i])
	i += 2 + (int(hs[i])<<8 | int(hs[i+1]))
	i += 1 + int(hs[i])
	if i+2 > len(hs) {
		t.Fatalf("no extensions in the hello")
	}
	body := append(append([]byte(nil), hs[4:]...), byte(ext>>8), byte(ext), 0, 0)
	exts := int(hs[i])<<8 | int(hs[i+1]) + 4
	body[i-4], body[i-3] = byte(exts>>8), byte(exts)
	msg := append([]byte{1, byte(len(body) >> 16), byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{recordHandshake, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

// tunnelSeeds are what guests send after CONNECT: hellos for the host and
// others, split into records, with early data, and retried.
func tunnelSeeds(t testing.TB) [][]byte {
	hello := func(name string, protos ...string) []byte {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		go tls.Client(a, &tls.Config{ServerName: name, NextProtos: protos}).Handshake()
		rec, err := readRecord(b)
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	good, evil := hello(tunnelHost, "http/1.1"), hello("evil.test", "http/1.1")
	upper := hello(strings.ToUpper(tunnelHost))
	// The good hello in two records, split inside its body.
	body := good[recordHeaderLen:]
	split := append([]byte{recordHandshake, 3, 1, 0, 10}, body[:10]...)
	split = append(split, recordHandshake, 3, 1, byte((len(body)-10)>>8), byte(len(body)-10))
	split = append(split, body[10:]...)
	ccs := []byte{recordCCS, 3, 3, 0, 1, 1}
	early := []byte{recordAppData, 3, 3, 0, 4, 'e', 'a', 'r', 'l'}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	return [][]byte{
		good, evil, upper, split,
		withExtension(t, good, extECH), withExtension(t, good, extESNI),
		cat(good, evil),
		cat(good, ccs, early, good, []byte("GET / HTTP/1.1\r\n\r\n")),
		cat(split, ccs, evil),
		cat(good[:len(good)-3]),
		[]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"),
	}
}

func FuzzTunnelHello(f *testing.F) {
	for _, b := range tunnelSeeds(f) {
		f.Add(b, false)
		f.Add(b, true)
	}
	fp := newFuzzProxy(f, true)
	connect := []byte("CONNECT " + tunnelHost + ":443 HTTP/1.1\r\nHost: " + tunnelHost + ":443\r\n\r\n")
	f.Fuzz(func(t *testing.T, b []byte, hrr bool) {
		fp.origins.hrr = hrr
		in := append(append([]byte(nil), connect...), b...)
		_, hellos, _ := fp.run(t, in)
		for _, h := range hellos {
			if h.err != nil {
				t.Fatalf("guest bytes %q (retry %v): the origin's %s: %v", b, hrr, h.method, h.err)
			}
			if !strings.EqualFold(h.host, tunnelHost) {
				t.Fatalf("guest bytes %q (retry %v): the origin read a %s naming %q in a tunnel to %s", b, hrr, h.method, h.host, tunnelHost)
			}
			if slices.Contains(h.ext, extECH) || slices.Contains(h.ext, extECHOuter) || slices.Contains(h.ext, extESNI) {
				t.Fatalf("guest bytes %q (retry %v): the origin read a %s with ECH or ESNI: %v", b, hrr, h.method, h.ext)
			}
		}
	})
}

// TestFuzzTunnelReachesOrigins: the tunnel harness really relays: the
// good hello reaches the origin (both hellos with a retry), the others
// do not.
func TestFuzzTunnelReachesOrigins(t *testing.T) {
	fp := newFuzzProxy(t, true)
	connect := []byte("CONNECT " + tunnelHost + ":443 HTTP/1.1\r\n\r\n")
	seeds := tunnelSeeds(t)
	for _, tc := range []struct {
		seed int
		hrr  bool
		want []string
	}{
		{0, false, []string{"hello1"}},
		{1, false, nil},
		{2, false, []string{"hello1"}},
		{3, true, []string{"hello1"}},
		{4, false, nil},
		{5, false, nil},
		{6, true, []string{"hello1"}},
		{7, true, []string{"hello1", "hello2"}},
		{8, true, []string{"hello1"}},
		{9, false, nil},
		{10, false, nil},
	} {
		fp.origins.hrr = tc.hrr
		_, hellos, _ := fp.run(t, append(append([]byte(nil), connect...), seeds[tc.seed]...))
		var got []string
		for _, h := range hellos {
			got = append(got, h.method)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("seed %d (retry %v): the origin read %v, want %v: %+v", tc.seed, tc.hrr, got, tc.want, hellos)
		}
	}
}

// TestTunnelKilobyteHellosEnd: the hellos that held the fuzzer at
// 0 execs/s (testdata/fuzz/FuzzTunnelHello holds two it was minimizing)
// are kilobytes long, and the minimizer is quadratic in the length; the
// tunnel itself served each of them at once. Hellos of that class, and
// larger, split into a record per byte, behind ChangeCipherSpec and early
// data, retried, truncated or followed by more, end their tunnel as soon
// as the guest is done: the fuzz proxy gives a tunnel an hour to read a
// hello, so one that waits on a timer fails run's watchdog here.
func TestTunnelKilobyteHellosEnd(t *testing.T) {
	fp := newFuzzProxy(t, true)
	if fp.p.cfg.HandshakeTimeout < time.Hour {
		t.Fatalf("the tunnel fuzz proxy reads hellos within %v: a tunnel waiting on that timer would pass unseen", fp.p.cfg.HandshakeTimeout)
	}
	connect := []byte("CONNECT " + tunnelHost + ":443 HTTP/1.1\r\n\r\n")
	good := tunnelSeeds(t)[0]
	// perByte is good with every byte of its handshake message in a
	// record of its own.
	var perByte []byte
	for _, c := range good[recordHeaderLen:] {
		perByte = append(perByte, recordHandshake, 3, 1, 0, 1, c)
	}
	ccs := bytes.Repeat([]byte{recordCCS, 3, 3, 0, 1, 1}, 1000)
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	for _, tc := range []struct {
		name string
		b    []byte
		hrr  bool
		want []string
	}{
		{"kilobyte hello", good, false, []string{"hello1"}},
		{"a record per byte", perByte, false, []string{"hello1"}},
		{"a record per byte, retried", cat(perByte, ccs, perByte), true, []string{"hello1", "hello2"}},
		{"retried behind 1000 ChangeCipherSpec", cat(good, ccs, good), true, []string{"hello1", "hello2"}},
		{"retry cut short", cat(good, ccs, perByte[:len(perByte)/2]), true, []string{"hello1"}},
		{"hello cut short", perByte[:len(perByte)-1], false, nil},
		{"hello and a megabyte", cat(good, bytes.Repeat([]byte{recordAppData, 0x40, 0, 0, 0}, 200<<10)), false, []string{"hello1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp.origins.hrr = tc.hrr
			_, hellos, _ := fp.run(t, cat(connect, tc.b))
			var got []string
			for _, h := range hellos {
				if h.err != nil || !strings.EqualFold(h.host, tunnelHost) {
					t.Errorf("the origin's %s: host %q, %v", h.method, h.host, h.err)
				}
				got = append(got, h.method)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("the origin read %v, want %v", got, tc.want)
			}
		})
	}
}
