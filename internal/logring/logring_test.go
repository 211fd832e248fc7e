package logring

import (
	"fmt"
	"testing"
)

func TestRing(t *testing.T) {
	r := New(3)
	if lines, seq := r.Last(10); len(lines) != 0 || seq != 0 {
		t.Fatalf("empty ring = %q, %d", lines, seq)
	}
	fmt.Fprint(r, "a\nb\n")
	fmt.Fprint(r, "c\n")
	fmt.Fprint(r, "d\n")
	lines, seq := r.Last(10)
	if got := fmt.Sprintf("%s", lines); got != "[b c d]" || seq != 4 {
		t.Errorf("Last = %s, seq %d; want [b c d], 4", got, seq)
	}
	if lines, _ := r.Last(2); fmt.Sprintf("%s", lines) != "[c d]" {
		t.Errorf("Last(2) = %s", lines)
	}
	if lines, seq := r.Since(2); fmt.Sprintf("%s", lines) != "[c d]" || seq != 4 {
		t.Errorf("Since(2) = %s, %d", lines, seq)
	}
	if lines, _ := r.Since(0); fmt.Sprintf("%s", lines) != "[b c d]" {
		t.Errorf("Since(0) after overflow = %s, want the 3 held lines", lines)
	}
	if lines, _ := r.Since(4); len(lines) != 0 {
		t.Errorf("Since(newest) = %s", lines)
	}
}
