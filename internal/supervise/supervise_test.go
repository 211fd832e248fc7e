package supervise

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestRestartsAndStops: a child that keeps dying is restarted; cancelling
// stops the running child.
func TestRestartsAndStops(t *testing.T) {
	dir := t.TempDir()
	count := filepath.Join(dir, "count")
	// Each run appends a line and exits at once, until the third, which stays.
	script := `echo run >> ` + count + `; n=$(wc -l < ` + count + `); [ "$n" -ge 3 ] && exec sleep 60; exit 1`
	var log syncBuf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Argv: []string{"sh", "-c", script}, Log: &log, What: "child", StopTimeout: time.Second})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, _ := os.ReadFile(count); strings.Count(string(b), "run") >= 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if b, _ := os.ReadFile(count); strings.Count(string(b), "run") < 3 {
		t.Fatalf("child not restarted: %q", b)
	}
	t0 := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if time.Since(t0) > 5*time.Second {
		t.Errorf("stopping took %s", time.Since(t0))
	}
	if strings.Count(log.String(), "child exited; restarting") != 2 {
		t.Errorf("log = %s", log.String())
	}
}
