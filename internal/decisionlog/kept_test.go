package decisionlog

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"
)

// TestKeptStream: Kept sinks get every line but allowed decisions —
// refusals within the client's budget, the aggregate of the rest,
// diagnostics written through Write and the overflow report — in order;
// Sinks get everything.
func TestKeptStream(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	all, kept := &sink{}, &sink{}
	w := New(Config{Sinks: []io.Writer{all}, Kept: []io.Writer{kept}, RefusalsPerClient: 2, FloodInterval: time.Hour, Now: clk.now})
	client := netip.MustParseAddr("10.10.10.2")
	line := func(i int, verdict string) *Line {
		return NewLine(clk.now(), slog.LevelInfo, "dns").Int("i", int64(i)).String("verdict", verdict)
	}
	for i := range 10 {
		w.EmitAllowed(line(i, "allow"))
		w.EmitRefusal(client, "not_allowlisted", line(i, "block"))
	}
	w.Emit(line(99, "block"))
	slog.New(slog.NewJSONHandler(w, nil)).Warn("allowlist reload rejected")
	clk.advance(time.Hour)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range kept.lines(t) {
		if l["verdict"] == "allow" {
			t.Errorf("an allowed line in the kept stream: %v", l)
		}
		got = append(got, l["msg"].(string))
	}
	want := []string{"dns", "dns", "dns", "allowlist reload rejected", "refusals aggregated"}
	if len(got) != len(want) {
		t.Fatalf("kept stream: %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("kept stream: %q, want %q", got, want)
		}
	}
	if n := len(all.lines(t)); n != 10+2+1+1+1 {
		t.Fatalf("all lines: %d, want 15", n)
	}
}

// TestKeptStreamGetsOverflowReport: the report of lines lost to a stuck
// sink is kept.
func TestKeptStreamGetsOverflowReport(t *testing.T) {
	all, kept := &sink{gate: make(chan struct{})}, &sink{}
	w := New(Config{Sinks: []io.Writer{all}, Kept: []io.Writer{kept}, MaxBytes: 256, MaxWait: time.Millisecond})
	for i := range 50 {
		w.EmitAllowed(NewLine(time.Now(), slog.LevelInfo, "dns").Int("i", int64(i)).String("verdict", "allow"))
	}
	close(all.gate)
	w.Close()
	for _, l := range kept.lines(t) {
		if l["msg"] == "decision log overflow" {
			return
		}
	}
	t.Fatalf("no overflow report in the kept stream: %v", kept.lines(t))
}
