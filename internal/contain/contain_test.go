package contain

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/time/rate"
)

// TestReportsAreBounded: a guest that triggers a panic in a loop gets at
// most a burst of lines into the (size-uncapped) diagnostics, every panic
// is counted, and the next line logged says how many went unlogged.
func TestReportsAreBounded(t *testing.T) {
	var buf bytes.Buffer
	r := New(slog.New(slog.NewJSONHandler(&buf, nil)))
	for range 50 {
		r.Report("http connection", "boom", "client", "10.10.10.2:4000")
	}
	if r.Count() != 50 {
		t.Fatalf("Count = %d, want 50", r.Count())
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != reportBurst {
		t.Fatalf("%d lines logged for 50 panics, want %d", len(lines), reportBurst)
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"level": "ERROR", "msg": "panic contained", "what": "http connection", "panic": "boom", "client": "10.10.10.2:4000"} {
		if first[k] != want {
			t.Errorf("%s = %v, want %q", k, first[k], want)
		}
	}
	if s, _ := first["stack"].(string); !strings.Contains(s, "contain.TestReportsAreBounded") {
		t.Errorf("the stack does not name the reporting goroutine: %q", s)
	}
	// The limiter refills: the next line carries the count of the others.
	r.lim = rate.NewLimiter(rate.Every(reportEvery), 1)
	r.Report("http connection", "boom")
	lines = strings.Split(strings.TrimSpace(buf.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, `"unlogged_before":45`) {
		t.Fatalf("the line after the suppressed ones: %s", last)
	}
	var nilR *Reporter
	nilR.Report("x", 1)
	if nilR.Count() != 0 {
		t.Fatal("a nil Reporter counted")
	}
}
