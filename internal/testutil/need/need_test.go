package need

import (
	"fmt"
	"testing"
)

// recorder catches what That does instead of ending the test.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper()                      {}
func (r *recorder) Fatalf(f string, args ...any) { r.fatal = fmt.Sprintf(f, args...) }
func (r *recorder) Skip(args ...any)             { r.skip = fmt.Sprint(args...) }

func TestThatFailsUnderCI(t *testing.T) {
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		r := &recorder{TB: t}
		That(r, false, "tool missing")
		if ci == "true" && (r.fatal == "" || r.skip != "") {
			t.Errorf("CI=true: fatal %q skip %q, want a failure", r.fatal, r.skip)
		}
		if ci == "" && (r.skip == "" || r.fatal != "") {
			t.Errorf("outside CI: fatal %q skip %q, want a skip", r.fatal, r.skip)
		}
		r = &recorder{TB: t}
		That(r, true, "present")
		if r.fatal != "" || r.skip != "" {
			t.Errorf("ok: fatal %q skip %q", r.fatal, r.skip)
		}
	}
}
