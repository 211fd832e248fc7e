package supervise

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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

// TestPrepareAndRestartLine: Prepare runs before every start and its
// release after it; the restart line is JSON carrying the attributes, and an
// attribute cannot overwrite the line's own fields.
func TestPrepareAndRestartLine(t *testing.T) {
	var log syncBuf
	var prepared, released atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Argv: []string{"sh", "-c", `echo "$MARK"; exit 3`}, Log: &log, What: "child",
			Attrs: map[string]string{"instance": "dev", "msg": "forged"},
			Prepare: func(cmd *exec.Cmd) (func(), error) {
				prepared.Add(1)
				cmd.Env = append(cmd.Env, "MARK=prepared")
				return func() { released.Add(1) }, nil
			},
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for prepared.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if prepared.Load() < 3 || released.Load() != prepared.Load() {
		t.Fatalf("prepared %d, released %d", prepared.Load(), released.Load())
	}
	var lines int
	for _, l := range strings.Split(log.String(), "\n") {
		if l == "prepared" || l == "" {
			continue
		}
		var rec map[string]string
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("restart line %q: %v", l, err)
		}
		if rec["msg"] != "child exited; restarting" || rec["instance"] != "dev" || !strings.Contains(rec["error"], "exit status 3") {
			t.Errorf("restart line %q", l)
		}
		lines++
	}
	if lines < 2 || !strings.Contains(log.String(), "prepared\n") {
		t.Errorf("log = %s", log.String())
	}
}

// TestPrepareErrorStops: a child that cannot be prepared is not started.
func TestPrepareErrorStops(t *testing.T) {
	err := Run(context.Background(), Config{
		Argv: []string{"true"}, Log: io.Discard, What: "child",
		Prepare: func(*exec.Cmd) (func(), error) { return nil, errors.New("no sockets") },
	})
	if err == nil || !strings.Contains(err.Error(), "preparing child: no sockets") {
		t.Fatalf("err = %v", err)
	}
}
