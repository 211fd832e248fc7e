package budget

import (
	"net/netip"
	"testing"
	"time"
)

// TestAllowN: a request costing n queries takes n tokens or none.
func TestAllowN(t *testing.T) {
	l := New(1, 5, 4)
	c, now := netip.MustParseAddr("10.10.0.2"), time.Unix(1000, 0)
	for i, want := range []bool{true, true, false} {
		if ok, _ := l.AllowN(c, now, 2); ok != want {
			t.Fatalf("AllowN #%d = %v, want %v", i, ok, want)
		}
	}
	if ok, _ := l.Allow(c, now); !ok {
		t.Fatal("the token a refused AllowN left was taken")
	}
	if ok, _ := l.Allow(c, now); ok {
		t.Fatal("more tokens than the burst")
	}
}
