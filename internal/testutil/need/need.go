// Package need lets a test state what the machine must give it: without
// it the test is skipped on a developer's machine, but fails under CI
// (CI=true), where `make test` installs everything and runs as root, so a
// skip there would hide a test that proves nothing.
package need

import (
	"os"
	"os/exec"
	"testing"
)

// That skips or fails t with why when ok is false.
func That(t testing.TB, ok bool, why string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: CI must run this test (make test installs what it needs and runs as root)", why)
		return
	}
	t.Skip(why)
}

// Root needs the test to run as root.
func Root(t testing.TB, why string) { That(t, os.Geteuid() == 0, why+": needs root") }

// Program needs name on PATH and returns its path.
func Program(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	That(t, err == nil, name+" not installed")
	return p
}
