package harness

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second run of one environment name waits for the first and, when its
// context ends first, fails naming the lock instead of tearing the first
// run's guests down.
func TestLockNameWaitsForTheHolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "abxe2e-x.lock")
	first, err := lockName(context.Background(), path, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if f, err := lockName(ctx, path, t.Logf); err == nil {
		f.Close()
		t.Fatal("a second holder got the lock while the first held it")
	} else if !strings.Contains(err.Error(), "another run holds") {
		t.Fatalf("error %q does not say another run holds the lock", err)
	}
	first.Close()
	second, err := lockName(context.Background(), path, t.Logf)
	if err != nil {
		t.Fatalf("lock not free after the holder closed it: %v", err)
	}
	second.Close()
}

// A Start of a name this process already runs takes it over (the test of
// leftovers does that), and the flock is released by the last Close only.
func TestTakeLockInOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "abxe2e-y.lock")
	a, err := takeLock(context.Background(), path, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	b, err := takeLock(context.Background(), path, t.Logf)
	if err != nil || b != a {
		t.Fatalf("second take in one process: %v, %v", b, err)
	}
	dropLock(a)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if f, err := lockName(ctx, path, t.Logf); err == nil {
		f.Close()
		t.Fatal("the flock was released while a holder remained")
	}
	dropLock(b)
	f, err := lockName(context.Background(), path, t.Logf)
	if err != nil {
		t.Fatalf("the flock is still held after the last drop: %v", err)
	}
	f.Close()
}
