package policy

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
)

func newEngine(t *testing.T, content string) *Engine {
	t.Helper()
	path := filepath.Join(t.TempDir(), "allowlist.txt")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := New(Config{AllowlistPath: path})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return e
}

func TestDecide(t *testing.T) {
	e := newEngine(t, "example.com\n*.example.org\n")
	tests := []struct {
		mode         Mode
		name         string
		verdict      allowlist.Verdict
		reason       string
		wantRecorded bool
	}{
		{Active, "example.com", allowlist.Allow, allowlist.ReasonAllowlisted, false},
		{Active, "other.com", allowlist.Block, allowlist.ReasonNotAllowlisted, false},
		{Active, "HealthCheck.abox.local.", allowlist.Allow, ReasonHealthcheck, false},
		{Active, "bad name", allowlist.Block, allowlist.ReasonInvalidName, false},
		{Passive, "other.com", allowlist.Allow, ReasonPassive, true},
		{Passive, "a.example.org", allowlist.Allow, allowlist.ReasonAllowlisted, true},
		{Passive, "healthcheck.abox.local", allowlist.Allow, ReasonHealthcheck, false},
		// Invalid names are blocked even in passive mode: they cannot be matched.
		{Passive, "bad\\.name", allowlist.Block, allowlist.ReasonInvalidName, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode)+"/"+tt.name, func(t *testing.T) {
			e.SetMode(tt.mode)
			e.ClearProfile()
			d := e.Decide(tt.name)
			if d.Verdict != tt.verdict || d.Reason != tt.reason {
				t.Errorf("Decide(%q) in %s = %+v, want %s/%s", tt.name, tt.mode, d, tt.verdict, tt.reason)
			}
			recorded := len(e.Profile().Entries) > 0
			if recorded != tt.wantRecorded {
				t.Errorf("recorded = %v, want %v", recorded, tt.wantRecorded)
			}
		})
	}
}

func TestNewStartsActiveAndCreatesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.txt")
	e, err := New(Config{AllowlistPath: path})
	if err != nil {
		t.Fatal(err)
	}
	if e.Mode() != Active {
		t.Errorf("mode = %s, want active", e.Mode())
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("allowlist file not created: %v", err)
	}
}

func TestNewRejectsInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(path, []byte("ok.example.com\n*\n"), 0o644)
	_, err := New(Config{AllowlistPath: path})
	if err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Fatalf("New with invalid file: err = %v, want file:line", err)
	}
}

func TestRejectedReloadKeepsList(t *testing.T) {
	e := newEngine(t, "example.com\n")
	os.WriteFile(e.Path(), []byte("example.com\nnew.example.net\n*.com\n"), 0o644)
	err := e.Reload()
	var pe *allowlist.ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Reload = %v, want ParseError", err)
	}
	if d := e.Decide("example.com"); d.Verdict != allowlist.Allow {
		t.Errorf("old entry lost after rejected reload: %+v", d)
	}
	if d := e.Decide("new.example.net"); d.Verdict != allowlist.Block {
		t.Errorf("entry of the rejected file applied: %+v", d)
	}
	st := e.Status()
	if !strings.Contains(st.LastError, ":3:") {
		t.Errorf("status LastError = %q, want the bad line", st.LastError)
	}
	os.WriteFile(e.Path(), []byte("new.example.net\n"), 0o644)
	if err := e.Reload(); err != nil {
		t.Fatal(err)
	}
	if st := e.Status(); st.LastError != "" || st.Entries != 1 {
		t.Errorf("status after good reload = %+v", st)
	}
	if e.Decide("example.com").Verdict != allowlist.Block || e.Decide("new.example.net").Verdict != allowlist.Allow {
		t.Errorf("good reload not applied")
	}
}

func TestAddRemove(t *testing.T) {
	e := newEngine(t, "# keep this comment\nexample.com # and this\n")
	added, err := e.Add("B.example.org", "*.example.net", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(added) != "[b.example.org *.example.net]" {
		t.Errorf("added = %v", added)
	}
	if e.Decide("b.example.org").Verdict != allowlist.Allow || e.Decide("x.example.net").Verdict != allowlist.Allow {
		t.Errorf("added entries not in force")
	}
	data, _ := os.ReadFile(e.Path())
	if !strings.Contains(string(data), "# keep this comment") || !strings.Contains(string(data), "b.example.org\n") {
		t.Errorf("file after add:\n%s", data)
	}
	// Nothing is written when one entry is invalid.
	if _, err := e.Add("ok.example.com", "*"); err == nil {
		t.Fatal("Add with an invalid entry succeeded")
	}
	if e.Decide("ok.example.com").Verdict != allowlist.Block {
		t.Errorf("partial add applied")
	}
	if _, err := e.Remove("example.com", "missing.example.com"); err == nil || !strings.Contains(err.Error(), "missing.example.com") {
		t.Fatalf("Remove of a missing entry: %v", err)
	}
	if e.Decide("example.com").Verdict != allowlist.Allow {
		t.Errorf("failed remove changed the list")
	}
	if _, err := e.Remove("EXAMPLE.com."); err != nil {
		t.Fatal(err)
	}
	if e.Decide("example.com").Verdict != allowlist.Block {
		t.Errorf("removed entry still allowed")
	}
	data, _ = os.ReadFile(e.Path())
	if strings.Contains(string(data), "example.com # and this") || !strings.Contains(string(data), "# keep this comment") {
		t.Errorf("file after remove:\n%s", data)
	}
}

func TestProfileBounded(t *testing.T) {
	p := NewProfile(3)
	now := time.Now()
	for i := 0; i < 10; i++ {
		p.Record(fmt.Sprintf("n%d.example.com", i%5), false, now)
	}
	s := p.Snapshot()
	if len(s.Entries) != 3 {
		t.Fatalf("entries = %d, want 3", len(s.Entries))
	}
	if s.Dropped != 4 {
		t.Errorf("dropped = %d, want 4", s.Dropped)
	}
	if s.Entries[0].Count != 2 {
		t.Errorf("count = %d, want 2 (de-duplicated)", s.Entries[0].Count)
	}
}

// waitFor polls cond until it holds. The deadline is far beyond the
// debounce so a loaded machine's scheduling stalls do not fail the test;
// a reload that never happens still does.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("not within 10s: %s", what)
}

func TestWatch(t *testing.T) {
	e := newEngine(t, "one.example.com\n")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); e.Watch(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	// Watch has no readiness signal: rewrite the file (same content) until a
	// reload shows the watch is live, so the edits below cannot be missed.
	// Writes are spaced beyond the debounce, which each event restarts.
	for deadline := time.Now().Add(10 * time.Second); e.Status().Reloads == 0; time.Sleep(4 * watchDebounce) {
		if time.Now().After(deadline) {
			t.Fatal("allowlist watch did not start within 10s")
		}
		os.WriteFile(e.Path(), []byte("one.example.com\n"), 0o644)
	}

	allowed := func(n string) func() bool {
		return func() bool { return e.Decide(n).Verdict == allowlist.Allow }
	}
	dir := filepath.Dir(e.Path())

	t.Run("in-place write", func(t *testing.T) {
		os.WriteFile(e.Path(), []byte("two.example.com\n"), 0o644)
		waitFor(t, "two allowed", allowed("two.example.com"))
	})
	t.Run("rename over", func(t *testing.T) {
		tmp := filepath.Join(dir, ".allowlist.txt.swp")
		os.WriteFile(tmp, []byte("three.example.com\n"), 0o644)
		if err := os.Rename(tmp, e.Path()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "three allowed", allowed("three.example.com"))
	})
	t.Run("delete then recreate", func(t *testing.T) {
		os.Remove(e.Path())
		time.Sleep(300 * time.Millisecond)
		if !allowed("three.example.com")() {
			t.Fatal("list dropped while the file was missing")
		}
		os.WriteFile(e.Path(), []byte("four.example.com\n"), 0o644)
		waitFor(t, "four allowed", allowed("four.example.com"))
	})
	t.Run("invalid edit keeps list", func(t *testing.T) {
		os.WriteFile(e.Path(), []byte("five.example.com\n*.com\n"), 0o644)
		waitFor(t, "error recorded", func() bool { return strings.Contains(e.Status().LastError, ":2:") })
		if !allowed("four.example.com")() || allowed("five.example.com")() {
			t.Fatal("rejected file changed the list")
		}
	})
}

func TestConcurrentDecideAndEdit(t *testing.T) {
	e := newEngine(t, "base.example.com\n")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if e.Decide("base.example.com").Verdict != allowlist.Allow {
					t.Error("base entry flickered")
					return
				}
			}
		}()
	}
	for i := 0; i < 20; i++ {
		name := fmt.Sprintf("n%d.example.com", i)
		if _, err := e.Add(name); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, err := e.Remove(name); err != nil {
				t.Fatal(err)
			}
		}
		e.SetMode(Passive)
		e.SetMode(Active)
	}
	close(stop)
	wg.Wait()
	if got := e.List().Len(); got != 11 {
		t.Errorf("entries = %d, want 11", got)
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"active", "PASSIVE", " passive ", "learn", "Learn"} {
		if _, err := ParseMode(s); err != nil {
			t.Errorf("ParseMode(%q): %v", s, err)
		}
	}
	if _, err := ParseMode("off"); err == nil || !strings.Contains(err.Error(), "use active, passive or learn") {
		t.Errorf("ParseMode(off) = %v", err)
	}
}
