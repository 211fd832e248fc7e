package decisionlog

import (
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func refusal(w *Writer, client, reason string, i int) {
	l := NewLine(time.Now(), slog.LevelInfo, "dns")
	l.String("client", client).String("reason", reason).Int("i", int64(i))
	w.EmitRefusal(netip.MustParseAddr(client), reason, l)
}

// TestRefusalFloodAggregated: one client's flood of refusals writes its
// budget of lines and then one "refusals aggregated" line carrying the
// count per reason; another client's refusals in the same interval are
// written as usual. 100000 refusals cost a few kilobytes, not megabytes.
func TestRefusalFloodAggregated(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := &sink{}
	w := New(Config{Sinks: []io.Writer{s}, RefusalsPerClient: 5, FloodInterval: time.Hour, Now: clk.now})
	for i := range 100000 {
		reason := "not_allowlisted"
		if i%4 == 0 {
			reason = "sni_mismatch"
		}
		refusal(w, "10.10.7.2", reason, i)
	}
	for i := range 3 {
		refusal(w, "10.10.8.2", "not_allowlisted", i)
	}
	clk.advance(time.Hour)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var flooder, other int
	var summary map[string]any
	for _, l := range s.lines(t) {
		switch {
		case l["msg"] == "refusals aggregated":
			if summary != nil {
				t.Errorf("two aggregate lines: %v and %v", summary, l)
			}
			summary = l
		case l["client"] == "10.10.7.2":
			flooder++
		case l["client"] == "10.10.8.2":
			other++
		}
	}
	if flooder != 5 || other != 3 {
		t.Errorf("lines written: flooder %d (want its budget, 5), other %d (want 3)", flooder, other)
	}
	if summary == nil {
		t.Fatal("no aggregate line")
	}
	if summary["client"] != "10.10.7.2" || summary["suppressed"] != float64(100000-5) || summary["level"] != "WARN" {
		t.Errorf("aggregate line %v, want client 10.10.7.2 suppressed %d", summary, 100000-5)
	}
	if r, _ := summary["reasons"].(string); !strings.Contains(r, "not_allowlisted=") || !strings.Contains(r, "sni_mismatch=") {
		t.Errorf("aggregate reasons %q, want counts per reason", r)
	}
	if st := w.Stats(); st.Suppressed != 100000-5 {
		t.Errorf("stats suppressed %d, want %d", st.Suppressed, 100000-5)
	}
	if n := s.b.Len(); n > 16<<10 {
		t.Errorf("the flood wrote %d bytes", n)
	}
}

// TestRefusalBudgetPerInterval: the budget is per interval: after the
// aggregate line, the next interval writes lines again.
func TestRefusalBudgetPerInterval(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := &sink{}
	w := New(Config{Sinks: []io.Writer{s}, RefusalsPerClient: 2, FloodInterval: 20 * time.Millisecond, Now: clk.now})
	for i := range 10 {
		refusal(w, "10.0.0.9", "r", i)
	}
	clk.advance(time.Second)
	// Wait for the aggregation tick to close the window.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		w.Sync()
		if strings.Contains(s.String(), "refusals aggregated") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no aggregate line after the interval")
		}
	}
	for i := range 10 {
		refusal(w, "10.0.0.9", "r", 100+i)
	}
	w.Close()
	var written int
	for _, l := range s.lines(t) {
		if l["msg"] == "dns" {
			written++
		}
	}
	if written != 4 {
		t.Errorf("%d refusal lines written over two intervals, want 2+2", written)
	}
}

func (s *sink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSinkErrorInStats: a failing sink (a full disk) shows in Stats with
// its error until a batch is written again.
func TestSinkErrorInStats(t *testing.T) {
	s := &sink{err: errors.New("no space left on device")}
	w := New(Config{Sinks: []io.Writer{s}})
	defer w.Close()
	emitN(w, 0, 3)
	w.Sync()
	if st := w.Stats(); !strings.Contains(st.LastError, "no space left") || st.LastErrorAt.IsZero() {
		t.Errorf("stats %+v, want the sink's error", st)
	}
	s.mu.Lock()
	s.err = nil
	s.mu.Unlock()
	emitN(w, 0, 1)
	w.Sync()
	if st := w.Stats(); st.LastError != "" {
		t.Errorf("stats %+v after a good write, want no error", st)
	}
}

// TestOpenFileRotates: a decision log file is rotated at its size cap and
// only the configured backups are kept, so however much a guest logs, the
// directory holds at most (backups+1) x cap.
func TestOpenFileRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "logs", "http.log")
	f, err := OpenFile(path, FileConfig{MaxMB: 1, Backups: 2})
	if err != nil {
		t.Fatal(err)
	}
	w := New(Config{Sinks: []io.Writer{f}, RefusalsPerClient: -1})
	line := strings.Repeat("x", 1000)
	for i := range 8000 { // ~8 MB
		l := NewLine(time.Now(), slog.LevelInfo, "request")
		l.Int("i", int64(i)).String("pad", line)
		w.Emit(l)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var files []string
	var total int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Dir(path))
		files, total = nil, 0
		for _, e := range ents {
			fi, _ := e.Info()
			files = append(files, e.Name())
			total += fi.Size()
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s mode %v, want 0600", e.Name(), fi.Mode().Perm())
			}
		}
		if len(files) <= 3 || time.Now().After(deadline) {
			break // old backups are removed in the background
		}
	}
	if len(files) > 3 {
		t.Errorf("%d files %v, want the log and at most 2 backups", len(files), files)
	}
	if total > 3*(1<<20)+(2<<20) {
		t.Errorf("logs take %d bytes, want at most about 3 MB", total)
	}
	if st, _ := os.Stat(filepath.Dir(path)); st.Mode().Perm() != 0o700 {
		t.Errorf("log directory mode %v, want 0700", st.Mode().Perm())
	}
}

// BenchmarkEmitRefusalFlood: the cost of one refusal line past the client's
// budget (counted, not written), against BenchmarkEmit's written line.
func BenchmarkEmitRefusalFlood(b *testing.B) {
	w := New(Config{Sinks: []io.Writer{io.Discard}, FloodInterval: time.Hour})
	defer w.Close()
	client := netip.MustParseAddr("10.10.7.2")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l := NewLine(time.Now(), slog.LevelInfo, "dns")
		l.String("client", "10.10.7.2").String("name", "blocked.example.org").String("reason", "not_allowlisted")
		w.EmitRefusal(client, "not_allowlisted", l)
	}
}

// TestAdmitRefusal: asking first gives the same verdicts as EmitRefusal,
// client by client, and counts what is not admitted as suppressed.
func TestAdmitRefusal(t *testing.T) {
	w := New(Config{Sinks: []io.Writer{io.Discard}, RefusalsPerClient: 3, FloodInterval: time.Hour})
	defer w.Close()
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var got []bool
	for range 5 {
		got = append(got, w.AdmitRefusal(a, "not_allowlisted"))
	}
	got = append(got, w.AdmitRefusal(b, "not_allowlisted"))
	want := []bool{true, true, true, false, false, true}
	if !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
	if st := w.Stats(); st.Suppressed != 2 {
		t.Errorf("suppressed %d, want 2", st.Suppressed)
	}
}

// TestLocalAnswersAggregated: lines of answers that reached nothing (the
// healthcheck) are held to their own budget per client and interval: a
// flood of them writes the budget and one "local answers aggregated" line,
// to Sinks only, and leaves the refusal budget untouched.
func TestLocalAnswersAggregated(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	all, kept := &sink{}, &sink{}
	w := New(Config{Sinks: []io.Writer{all}, Kept: []io.Writer{kept}, LocalPerClient: 5, RefusalsPerClient: 3, FloodInterval: time.Hour, Now: clk.now})
	client := netip.MustParseAddr("10.10.7.2")
	for i := range 10000 {
		w.EmitLocal(client, "healthcheck", NewLine(clk.now(), slog.LevelInfo, "request").String("reason", "healthcheck").Int("i", int64(i)))
	}
	for i := range 3 {
		refusal(w, "10.10.7.2", "not_allowlisted", i)
	}
	clk.advance(time.Hour)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var local, refused int
	var summary map[string]any
	for _, l := range all.lines(t) {
		switch {
		case l["msg"] == "local answers aggregated":
			summary = l
		case l["reason"] == "healthcheck":
			local++
		case l["reason"] == "not_allowlisted":
			refused++
		}
	}
	if local != 5 || refused != 3 {
		t.Errorf("lines written: %d healthcheck (want the budget, 5), %d refusals (want 3)", local, refused)
	}
	if summary == nil || summary["suppressed"] != float64(10000-5) || summary["client"] != "10.10.7.2" || summary["reasons"] != "healthcheck=9995" {
		t.Errorf("aggregate line %v, want client 10.10.7.2 suppressed 9995", summary)
	}
	for _, l := range kept.lines(t) {
		if l["reason"] == "healthcheck" || l["msg"] == "local answers aggregated" {
			t.Errorf("kept stream holds a local answer's line: %v", l)
		}
	}
}
