package connio

import (
	"bytes"
	"io"
	mrand "math/rand/v2"
	"testing"
	"time"
)

// TestBigBufferBudget: the large buffers of bulk transfers are taken under
// one process-wide budget. Once it is spent no more are handed out, the
// transfers go on with ordinary buffers (a coalesced TLS write still
// reaches the peer whole, with nothing held), and every buffer given back
// returns its bytes to the budget.
func TestBigBufferBudget(t *testing.T) {
	base := bigBytesInUse.Load()
	var held []*[]byte
	for {
		b := bulkBufs.get()
		if b == nil {
			break
		}
		held = append(held, b)
		if len(held) > maxBigBytes/bulkBuf+1 {
			t.Fatalf("%d bulk buffers handed out, over the %d MiB budget", len(held), maxBigBytes>>20)
		}
	}
	if used := bigBytesInUse.Load(); used > maxBigBytes {
		t.Fatalf("%d bytes of large buffers in use, budget %d", used, maxBigBytes)
	}
	if b := readBufs.get(); b != nil {
		t.Fatal("a read buffer was handed out past the budget")
	}
	buf, release := BulkOrCopyBuf()
	if len(buf) != bigBuf {
		t.Errorf("past the budget a bulk copy got a %d-byte buffer, want the ordinary %d", len(buf), bigBuf)
	}
	release()

	fc, _, client := tlsPair(t)
	b := pattern(300 << 10)
	if n, err := fc.Write(b); err != nil || n != len(b) {
		t.Fatalf("coalesced Write past the budget = %d, %v", n, err)
	}
	if h := fc.co.held(); h != 0 {
		t.Fatalf("%d bytes held by a coalescer that had no buffer", h)
	}
	got := make([]byte, len(b))
	client.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, b) {
		t.Fatalf("a write past the budget arrived: %v, exact %v", err, bytes.Equal(got, b))
	}

	for _, b := range held {
		bulkBufs.put(b)
	}
	if used := bigBytesInUse.Load(); used != base {
		t.Errorf("after giving every buffer back %d bytes are counted in use, want %d", used, base)
	}
}

// pattern is n deterministic, non-repeating bytes.
func pattern(n int) []byte {
	b := make([]byte, n)
	r := mrand.NewChaCha8([32]byte{1, 2, 3})
	r.Read(b)
	return b
}
