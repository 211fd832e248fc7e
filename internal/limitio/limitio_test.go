package limitio

import (
	"bytes"
	"errors"
	"testing"
)

func TestBuffer(t *testing.T) {
	b := &Buffer{Max: 4}
	if n, err := b.Write([]byte("abcdef")); n != 6 || err != nil || string(b.Bytes()) != "abcd" || !b.Over() {
		t.Errorf("dropping: %d %v %q %v", n, err, b.Bytes(), b.Over())
	}
	f := &Buffer{Max: 4, Fail: true}
	f.Write([]byte("ab"))
	if n, err := f.Write([]byte("cdef")); n != 2 || !errors.Is(err, ErrTooLarge) || string(f.Bytes()) != "abcd" {
		t.Errorf("failing: %d %v %q", n, err, f.Bytes())
	}
}

// TestTail: Tail keeps exactly the last Max bytes of any sequence of
// writes, in memory bounded by 2×Max, and marks a cut.
func TestTail(t *testing.T) {
	var all []byte
	tl := &Tail{Max: 100}
	for i := range 5000 {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, i%250)
		all = append(all, p...)
		tl.Write(p)
		if len(tl.b) > 2*tl.Max {
			t.Fatalf("after %d bytes Tail holds %d", len(all), len(tl.b))
		}
		want := string(all)
		if len(all) > tl.Max {
			want = "…" + string(all[len(all)-tl.Max:])
		}
		if got := tl.String(); got != want {
			t.Fatalf("after %d bytes: String() = %q, want %q", len(all), got, want)
		}
	}
}
