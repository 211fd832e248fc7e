package connio

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-acc
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// TestTunnelBulkThenTrickle relays a bulk transfer and then a trickle
// through pipe with both ends wrapped as in a real tunnel (guard after
// CONNECT, idle timeout): the bytes arrive intact, are counted on both
// IdleConns, and the trickle after the bulk phase (gaps shorter than the
// idle timeout, back on the small buffer) keeps the tunnel open.
func TestTunnelBulkThenTrickle(t *testing.T) {
	// The margins are wide (a gap is 0.6s, the timeout 1.6s) so that a
	// loaded machine's scheduling delays do not close the tunnel.
	const idle = 1600 * time.Millisecond
	guest, clientEnd := tcpPair(t)
	upEnd, origin := tcpPair(t)
	cic := NewIdleConn(clientEnd, idle, nil)
	g := NewH1Guard(cic, 64<<10, nil)
	g.st = stPass // as after a CONNECT
	uic := NewIdleConn(upEnd, idle, nil)

	payload := make([]byte, 16<<20)
	rand.Read(payload)
	trickle := []byte("tick!")
	done := make(chan [2]int64, 1)
	go func() {
		ab, ba := Pipe(g, uic, nil)
		done <- [2]int64{ab, ba}
	}()
	go func() {
		origin.Write(payload)
		for _, b := range trickle {
			time.Sleep(idle * 3 / 8)
			origin.Write([]byte{b})
		}
		origin.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(guest)
	if err != nil {
		t.Fatal(err)
	}
	want := append(append([]byte(nil), payload...), trickle...)
	if !bytes.Equal(got, want) {
		t.Fatalf("received %d bytes, want %d (or content differs)", len(got), len(want))
	}
	guest.Close()
	n := <-done
	if n[1] != int64(len(want)) {
		t.Errorf("pipe counted %d bytes down, want %d", n[1], len(want))
	}
	if cic.tx.Load() != int64(len(want)) || uic.rx.Load() != int64(len(want)) {
		t.Errorf("IdleConn counts: client tx %d, upstream rx %d, want %d", cic.tx.Load(), uic.rx.Load(), len(want))
	}
}

// TestTunnelBulkIdleStillCloses: a tunnel that goes quiet after a bulk
// transfer is closed by the idle timeout.
func TestTunnelBulkIdleStillCloses(t *testing.T) {
	const idle = 300 * time.Millisecond
	guest, clientEnd := tcpPair(t)
	upEnd, origin := tcpPair(t)
	cic := NewIdleConn(clientEnd, idle, nil)
	uic := NewIdleConn(upEnd, idle, nil)
	done := make(chan struct{})
	go func() {
		Pipe(cic, uic, nil)
		close(done)
	}()
	origin.Write(make([]byte, 8<<20))
	go io.Copy(io.Discard, guest)
	select {
	case <-done:
	case <-time.After(100 * idle): // far beyond the timeout, for a loaded machine
		t.Fatal("idle tunnel still open")
	}
}
