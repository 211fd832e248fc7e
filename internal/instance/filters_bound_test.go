package instance

import (
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
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

// TestBoundFiltersHard: past FiltersMemoryMax the daemon's process cannot
// grow at all (a child, so that the bound stays out of the test process):
// an allocation above it ends the process, where without the bound it
// succeeds (the pages are never touched, so it costs the host nothing).
func TestBoundFiltersHard(t *testing.T) {
	if os.Getenv("ABOX_BOUND_CHILD") != "" {
		if os.Getenv("ABOX_BOUND_CHILD") == "bound" {
			boundFilters()
		}
		b := make([]byte, FiltersMemoryMax+(256<<20))
		runtime.KeepAlive(b)
		os.Stdout.WriteString("allocated\n")
		os.Exit(0)
	}
	run := func(mode string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestBoundFiltersHard$")
		cmd.Env = append(os.Environ(), "ABOX_BOUND_CHILD="+mode, "GOMEMLIMIT=off")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("unbound"); err != nil || !strings.Contains(out, "allocated") {
		t.Skipf("this host cannot reserve %d bytes even without the bound (%v: %s)", FiltersMemoryMax+(256<<20), err, firstLine(out))
	}
	out, err := run("bound")
	if err == nil || strings.Contains(out, "allocated") || !strings.Contains(out, "out of memory") {
		t.Errorf("an allocation past the hard bound: err %v, output %q; want the process ended out of memory", err, out)
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}
