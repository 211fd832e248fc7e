package decisionlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/logring"
)

// sink is a sink that records writes and can be held shut or made to fail.
type sink struct {
	mu     sync.Mutex
	b      bytes.Buffer
	writes int
	gate   chan struct{} // when non-nil, each write waits for it to close
	err    error
}

func (s *sink) Write(p []byte) (int, error) {
	if s.gate != nil {
		<-s.gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.err != nil {
		return 0, s.err
	}
	return s.b.Write(p)
}

func (s *sink) lines(t *testing.T) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.SplitAfter(s.b.String(), "\n") {
		if l == "" {
			continue
		}
		if !strings.HasSuffix(l, "\n") {
			t.Fatalf("partial line %q", l)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func emitN(w *Writer, g, n int) {
	for i := range n {
		l := NewLine(time.Now(), slog.LevelInfo, "dns")
		l.Int("g", int64(g)).Int("i", int64(i)).String("name", "host.example\n")
		w.Emit(l)
	}
}

// TestWriterDelivers: every line from concurrent producers reaches every
// sink whole, in each producer's order, with few writes.
func TestWriterDelivers(t *testing.T) {
	file, ring := &sink{}, logring.New(100)
	w := New(Config{Sinks: []io.Writer{file, ring}})
	const producers, each = 8, 500
	var wg sync.WaitGroup
	for g := range producers {
		wg.Go(func() { emitN(w, g, each) })
	}
	wg.Wait()
	w.Sync()
	lines := file.lines(t)
	if len(lines) != producers*each {
		t.Fatalf("%d lines in the file, want %d", len(lines), producers*each)
	}
	next := make([]float64, producers)
	for _, l := range lines {
		g := int(l["g"].(float64))
		if l["i"].(float64) != next[g] {
			t.Fatalf("producer %d: line %v after %v", g, l["i"], next[g]-1)
		}
		next[g]++
	}
	if file.writes >= producers*each/10 {
		t.Errorf("%d writes for %d lines, want batches", file.writes, producers*each)
	}
	got, seq := ring.Last(100)
	if seq != producers*each || len(got) != 100 {
		t.Fatalf("ring holds %d lines, seq %d; want 100, %d", len(got), seq, producers*each)
	}
	tail := strings.SplitAfter(strings.TrimSuffix(file.b.String(), "\n"), "\n")
	for i, l := range got {
		if want := strings.TrimSuffix(tail[len(tail)-100+i], "\n"); string(l) != want {
			t.Fatalf("ring line %d = %s, file has %s", i, l, want)
		}
	}
	if st := w.Stats(); st.Lines != producers*each || st.Dropped != 0 {
		t.Errorf("stats %+v, want %d lines, none dropped", st, producers*each)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestWriterFlushesAlone: lines reach the sinks within the interval
// without Sync or more lines.
func TestWriterFlushesAlone(t *testing.T) {
	s := &sink{}
	w := New(Config{Sinks: []io.Writer{s}, Interval: 10 * time.Millisecond})
	defer w.Close()
	emitN(w, 0, 1)
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.mu.Lock()
		n := s.b.Len()
		s.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("line not written within 2s with a 10ms interval")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestWriterBackpressure: with the sink stuck, a producer waits MaxWait
// once, then lines are dropped at once, counted, and reported in the log
// when the sink recovers; nothing queued is lost.
func TestWriterBackpressure(t *testing.T) {
	gate := make(chan struct{})
	s := &sink{gate: gate}
	const maxWait = 50 * time.Millisecond
	w := New(Config{Sinks: []io.Writer{s}, MaxBytes: 4 << 10, MaxWait: maxWait, Interval: time.Millisecond})
	start := time.Now()
	const total = 500
	emitN(w, 0, total) // ~90 bytes a line: the flusher is stuck on the first batch, the queue fills
	el := time.Since(start)
	st := w.Stats()
	if st.Dropped == 0 || st.Waits == 0 {
		t.Fatalf("stats %+v with a stuck sink, want waits and drops", st)
	}
	// One wait, not one per line: counted rather than timed, so a loaded
	// machine cannot fail it. The flusher may take the first batch only
	// after the queue filled once, which costs a second wait.
	if el < maxWait || st.Waits > 2 {
		t.Errorf("%d lines took %s and %d waits with a stuck sink, want one MaxWait (%s), at most 2 waits", total, el, st.Waits, maxWait)
	}
	if st.Lines+st.Dropped != total {
		t.Errorf("lines %d + dropped %d != %d emitted", st.Lines, st.Dropped, total)
	}
	close(gate)
	w.Sync()
	lines := s.lines(t)
	last := lines[len(lines)-1]
	if last["msg"] != "decision log overflow" || last["level"] != "WARN" || last["dropped"] != float64(st.Dropped) {
		t.Errorf("last line %v, want the overflow report with dropped=%d", last, st.Dropped)
	}
	if got := uint64(len(lines) - 1); got != st.Lines {
		t.Errorf("%d decision lines written, want the %d queued", got, st.Lines)
	}
	// Recovered: lines flow again without waits.
	before := w.Stats()
	emitN(w, 1, 10)
	w.Sync()
	if st := w.Stats(); st.Waits != before.Waits || st.Dropped != before.Dropped || st.Lines != before.Lines+10 {
		t.Errorf("stats %+v after recovery from %+v, want 10 more lines, no waits or drops", st, before)
	}
	if err := w.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestWriterWaitsForSlowSink: a sink slower than the producers but not
// stuck costs waits, never lines.
func TestWriterWaitsForSlowSink(t *testing.T) {
	s := &slowSink{d: 2 * time.Millisecond}
	w := New(Config{Sinks: []io.Writer{s}, MaxBytes: 2 << 10, MaxWait: 5 * time.Second, Interval: time.Millisecond})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() { emitN(w, g, 200) })
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if st.Dropped != 0 || st.Lines != 800 {
		t.Errorf("stats %+v, want 800 lines, none dropped", st)
	}
	if st.Waits == 0 {
		t.Errorf("no waits with a 2KiB queue and a slow sink; the test does not test backpressure")
	}
	if n := strings.Count(s.b.String(), "\n"); n != 800 {
		t.Errorf("%d lines written, want 800", n)
	}
}

type slowSink struct {
	d time.Duration
	b bytes.Buffer // written by the flusher only; read after Close
}

func (s *slowSink) Write(p []byte) (int, error) {
	time.Sleep(s.d)
	return s.b.Write(p)
}

// TestWriterSinkError: a failing sink is counted and reported by Close;
// the other sinks still get every line.
func TestWriterSinkError(t *testing.T) {
	bad, good := &sink{err: errors.New("disk full")}, &sink{}
	w := New(Config{Sinks: []io.Writer{bad, good}})
	emitN(w, 0, 10)
	err := w.Close()
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("Close = %v, want the sink's error", err)
	}
	if got := len(good.lines(t)); got != 10 {
		t.Errorf("good sink has %d lines, want 10", got)
	}
	if st := w.Stats(); st.WriteErrors == 0 {
		t.Errorf("stats %+v, want write errors", st)
	}
}

// TestWriterClose: Close writes what is queued; later lines are counted as dropped.
func TestWriterClose(t *testing.T) {
	s := &sink{}
	w := New(Config{Sinks: []io.Writer{s}, Interval: time.Hour})
	emitN(w, 0, 3)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if got := len(s.lines(t)); got != 3 {
		t.Errorf("%d lines after Close, want 3", got)
	}
	emitN(w, 0, 2)
	w.Sync() // returns at once after Close
	if st := w.Stats(); st.Dropped != 2 {
		t.Errorf("dropped %d after Close, want 2", st.Dropped)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestWriterSlog: slog lines share the stream, in order with Emit's.
func TestWriterSlog(t *testing.T) {
	s := &sink{}
	w := New(Config{Sinks: []io.Writer{s}})
	log := slog.New(slog.NewJSONHandler(w, nil))
	for i := range 3 {
		emitN(w, 0, 1)
		log.Warn("diag", "i", i)
	}
	w.Close()
	lines := s.lines(t)
	var msgs []string
	for _, l := range lines {
		msgs = append(msgs, fmt.Sprint(l["msg"]))
	}
	if got, want := strings.Join(msgs, ","), "dns,diag,dns,diag,dns,diag"; got != want {
		t.Errorf("messages %s, want %s", got, want)
	}
}

// BenchmarkEmit is the producer's side: encode a decision line and queue it.
func BenchmarkEmit(b *testing.B) {
	w := New(Config{Sinks: []io.Writer{discard{}}})
	defer w.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w.Emit(dnsLine(time.Now()))
		}
	})
	b.StopTimer()
	if st := w.Stats(); st.Dropped != 0 {
		b.Logf("%d of %d lines dropped", st.Dropped, st.Lines+st.Dropped)
	}
}

// TestBatchLinesAsEmitted: lines queued through a Batch are byte for byte
// the lines Emit and EmitAllowed write, in order, each counted, those of
// allowed decisions to Sinks only; a line started and not finished is
// never written; a full queue drops and counts a batch's lines one by one.
func TestBatchLinesAsEmitted(t *testing.T) {
	one, oneKept, batched, batchedKept := &sink{}, &sink{}, &sink{}, &sink{}
	w1 := New(Config{Sinks: []io.Writer{one}, Kept: []io.Writer{oneKept}})
	w2 := New(Config{Sinks: []io.Writer{batched}, Kept: []io.Writer{batchedKept}})
	at := time.Date(2026, 12, 1, 23, 0, 0, 123400000, time.UTC)
	fill := func(l *Line, i int) {
		l.Addr("client", netip.MustParseAddr("10.10.10.2")).String("name", fmt.Sprintf("h%d.example\n", i)).Int("i", int64(i))
	}
	var b Batch
	for i := range 5 {
		level := slog.LevelInfo
		if i == 3 {
			level = slog.LevelWarn
		}
		l := NewLine(at, level, "dns")
		fill(l, i)
		fill(b.NewLine(at, level, "dns"), i)
		if i%2 == 0 { // an allowed decision
			w1.EmitAllowed(l)
			b.DoneAllowed()
		} else {
			w1.Emit(l)
			b.Done()
		}
	}
	fill(b.NewLine(at, slog.LevelInfo, "dns"), 99) // never finished
	if b.Len() != 5 {
		t.Errorf("batch of %d lines, want 5", b.Len())
	}
	w2.EmitBatch(&b)
	if b.Len() != 0 {
		t.Errorf("batch holds %d lines after EmitBatch, want none", b.Len())
	}
	w1.Sync()
	w2.Sync()
	if one.b.String() != batched.b.String() {
		t.Errorf("batched lines\n%s\nwant as emitted\n%s", batched.b.String(), one.b.String())
	}
	if got := len(batchedKept.lines(t)); oneKept.b.String() != batchedKept.b.String() || got != 2 {
		t.Errorf("batched lines kept (%d)\n%s\nwant as emitted (2)\n%s", got, batchedKept.b.String(), oneKept.b.String())
	}
	if st := w2.Stats(); st.Lines != 5 {
		t.Errorf("stats %+v, want 5 lines", st)
	}
	// Reused after EmitBatch: only the new lines.
	fill(b.NewLine(at, slog.LevelInfo, "dns"), 5)
	b.Done()
	w2.EmitBatch(&b)
	w2.Sync()
	if got := len(batched.lines(t)); got != 6 {
		t.Errorf("%d lines after a second batch, want 6", got)
	}

	// A stuck sink: the queue fills and a batch is dropped whole, each
	// of its lines counted.
	gate := make(chan struct{})
	stuck := &sink{gate: gate}
	w3 := New(Config{Sinks: []io.Writer{stuck}, MaxBytes: 1 << 10, MaxWait: time.Millisecond, Interval: time.Millisecond})
	for range 40 {
		for i := range 4 {
			fill(b.NewLine(at, slog.LevelInfo, "dns"), i)
			b.Done()
		}
		w3.EmitBatch(&b)
	}
	st := w3.Stats()
	if st.Dropped == 0 || st.Dropped%4 != 0 || st.Lines+st.Dropped != 160 {
		t.Errorf("stats %+v with a stuck sink, want whole batches of 4 dropped, lines + dropped = 160", st)
	}
	close(gate)
	for _, w := range []*Writer{w1, w2, w3} {
		if err := w.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}
