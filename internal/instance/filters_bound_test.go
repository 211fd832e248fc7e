package instance

import (
	"runtime/debug"
	"syscall"
	"testing"
)

// TestBoundFilters: the filter daemon's process gets its soft memory limit
// and a lower CPU priority (run in a child's place: the test process
// itself is changed, which is harmless).
func TestBoundFilters(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	boundFilters()
	if got := debug.SetMemoryLimit(-1); got != FiltersMemoryLimit {
		t.Errorf("memory limit %d, want %d", got, FiltersMemoryLimit)
	}
	p, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if nice := 20 - p; nice < FiltersNice {
		t.Errorf("nice %d, want at least %d", nice, FiltersNice)
	}
}
