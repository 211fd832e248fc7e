package limitio

import (
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
