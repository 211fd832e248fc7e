package httpfilter

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"net"
	"sync"
	"testing"
	"time"
)

// fakeHRROrigin is a TCP server that answers the first TLS record it gets
// with a HelloRetryRequest-shaped record and keeps every byte it receives.
type fakeHRROrigin struct {
	ln   net.Listener
	mu   sync.Mutex
	got  bytes.Buffer
	port string
}

func newFakeHRROrigin(t *testing.T) *fakeHRROrigin {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &fakeHRROrigin{ln: ln}
	_, o.port, _ = net.SplitHostPort(ln.Addr().String())
	serveRaw(t, ln, func(c net.Conn, _ *bufio.Reader) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		rec, err := readRecord(c)
		o.mu.Lock()
		o.got.Write(rec)
		o.mu.Unlock()
		if err != nil {
			return
		}
		// ServerHello with the HelloRetryRequest random.
		hs := append([]byte{2, 0, 0, 38, 3, 3}, helloRetryRandom...)
		c.Write(append([]byte{recordHandshake, 3, 3, 0, byte(len(hs))}, hs...))
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			o.mu.Lock()
			o.got.Write(buf[:n])
			o.mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	return o
}

func (o *fakeHRROrigin) received() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]byte(nil), o.got.Bytes()...)
}

// TestTunnelChecksHelloSentAhead: in a byte tunnel only the records of the
// ClientHello are relayed before the origin answers. A second ClientHello
// the client sends ahead, in the same segment, is not relayed with the
// first: after the origin's HelloRetryRequest it is checked like any
// retried hello (here: another server, refused). A ClientHello record that
// carries more handshake bytes than the hello (a second hello coalesced
// into the same record) is refused before anything is dialled.
func TestTunnelChecksHelloSentAhead(t *testing.T) {
	first := captureHello(t, &tls.Config{ServerName: "tunnel.test", NextProtos: []string{"http/1.1"}})
	evil := captureHello(t, &tls.Config{ServerName: "evil.example.org", NextProtos: []string{"http/1.1"}})

	t.Run("second hello in the same segment", func(t *testing.T) {
		h := newHarness(t, hopts{noMITM: true, allow: []string{"tunnel.test"}})
		o := newFakeHRROrigin(t)
		h.allowOrigin("tunnel.test", nil, o.port)
		c := h.connect(t, "tunnel.test:"+o.port)
		defer c.Close()
		c.Write(append(append([]byte(nil), first...), evil...))
		if !closedWithin(t, c) {
			t.Errorf("the tunnel stayed open after a second hello for another server")
		}
		h.waitLog(t, ReasonSNIMismatch)
		time.Sleep(100 * time.Millisecond)
		if got := o.received(); !bytes.Equal(got, first) {
			t.Errorf("origin received %d bytes, want exactly the first hello's %d (the second was relayed unchecked: %v)",
				len(got), len(first), bytes.Contains(got, evil[recordHeaderLen:]))
		}
	})

	t.Run("early data behind the first hello", func(t *testing.T) {
		// A 0-RTT client's CCS and early data ride behind its first hello;
		// after the retry they reach the origin ahead of the second hello,
		// in the order sent.
		h := newHarness(t, hopts{noMITM: true, allow: []string{"tunnel.test"}})
		o := newFakeHRROrigin(t)
		h.allowOrigin("tunnel.test", nil, o.port)
		ccs := []byte{recordCCS, 3, 3, 0, 1, 1}
		early := []byte{recordAppData, 3, 3, 0, 4, 'e', 'a', 'r', 'l'}
		second := captureHello(t, &tls.Config{ServerName: "tunnel.test", NextProtos: []string{"http/1.1"}})
		c := h.connect(t, "tunnel.test:"+o.port)
		defer c.Close()
		c.Write(bytes.Join([][]byte{first, ccs, early}, nil))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, hrr, err := readServerHello(c); err != nil || !hrr {
			t.Fatalf("want the retry request relayed: hrr=%v err=%v", hrr, err)
		}
		c.Write(second)
		want := bytes.Join([][]byte{first, ccs, early, second}, nil)
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(o.received()) < len(want); time.Sleep(10 * time.Millisecond) {
		}
		if got := o.received(); !bytes.Equal(got, want) {
			t.Errorf("origin received %d bytes, want the first hello, CCS, early data and second hello (%d bytes) in order", len(got), len(want))
		}
	})

	t.Run("second hello coalesced into the first record", func(t *testing.T) {
		d := &recordingDialer{}
		h := newHarness(t, hopts{noMITM: true, allow: []string{"tunnel.test"}, dialer: d})
		o := newFakeHRROrigin(t)
		h.allowOrigin("tunnel.test", nil, o.port)
		payload := append(append([]byte(nil), first[recordHeaderLen:]...), evil[recordHeaderLen:]...)
		rec := append([]byte{recordHandshake, 3, 1, byte(len(payload) >> 8), byte(len(payload))}, payload...)
		c := h.connect(t, "tunnel.test:"+o.port)
		defer c.Close()
		c.Write(rec)
		if !closedWithin(t, c) {
			t.Errorf("the tunnel stayed open")
		}
		h.waitLog(t, ReasonHelloTrailing)
		if got := d.dialed(); len(got) != 0 {
			t.Errorf("dialled %v", got)
		}
	})
}
