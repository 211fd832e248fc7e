package logring

import (
	"bytes"
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

// TestLinesReadStayPut: a line handed to a reader is its own copy; the ring
// reusing the storage of old lines never changes what a reader holds, nor
// does the writer's reuse of its batch buffer.
func TestLinesReadStayPut(t *testing.T) {
	r := New(2)
	batch := []byte("first line\nsecond line\n")
	r.Write(batch)
	held, _ := r.Last(2)
	copy(batch, "XXXXXXXXXXXXXXXXXXXXXX") // the writer reuses its buffer
	r.Write([]byte("third!!!!!\nfourth!!!!!\n"))
	if got := fmt.Sprintf("%s", held); got != "[first line second line]" {
		t.Errorf("lines read before later writes now read %s", got)
	}
	if lines, _ := r.Last(2); fmt.Sprintf("%s", lines) != "[third!!!!! fourth!!!!!]" {
		t.Errorf("Last = %s, want [third!!!!! fourth!!!!!]", lines)
	}
	long := bytes.Repeat([]byte{'x'}, 3*maxKept)
	r.Write(append(long, '\n'))
	r.Write([]byte("short\n"))
	r.Write([]byte("tiny\n"))
	for i, l := range r.lines {
		if cap(l) > maxKept {
			t.Errorf("slot %d keeps %d bytes after the long line was replaced", i, cap(l))
		}
	}
}

// BenchmarkWrite: batches of decision lines into a full ring.
func BenchmarkWrite(b *testing.B) {
	r := New(2000)
	line := []byte(`{"time":"2026-12-01T18:40:00.123456789Z","level":"INFO","msg":"dns","client":"127.0.0.1","name":"a0001.allowed.test","type":"A","verdict":"allow"}` + "\n")
	batch := bytes.Repeat(line, 64)
	b.ReportAllocs()
	for b.Loop() {
		r.Write(batch)
	}
}
