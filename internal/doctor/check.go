// Package doctor checks that abox can work on this host (check-deps) and that
// every isolation layer of a running instance holds (doctor): host-side
// checks of each layer, then negative probes from inside the guest.
package doctor

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/termtext"
)

// Status of one check.
type Status string

const (
	Pass Status = "pass"
	// Warn is a problem that does not break isolation or abox's main use.
	Warn Status = "warn"
	Fail Status = "fail"
	// Skip: the check could not run because an earlier layer is missing.
	Skip Status = "skip"
)

// Check is one line of a report.
type Check struct {
	// Layer groups checks: "host", "nwfilter", "hostfw", "daemon", "guest", ...
	Layer string `json:"layer"`
	// Name is short and stable, for scripts.
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was seen.
	Detail string `json:"detail,omitempty"`
	// Fix is the command or step that repairs a failure; empty on pass.
	Fix string `json:"fix,omitempty"`
}

// Report is the result of a run.
type Report struct {
	Checks []Check `json:"checks"`
	// Took is the wall time of the run in milliseconds.
	TookMS int64 `json:"took_ms"`
}

// Failed reports whether any check failed.
func (r Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// FailedLayers lists the layers with a failed check, in report order.
func (r Report) FailedLayers() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range r.Checks {
		if c.Status == Fail && !seen[c.Layer] {
			seen[c.Layer] = true
			out = append(out, c.Layer)
		}
	}
	return out
}

func (r *Report) add(c Check) { r.Checks = append(r.Checks, c) }

func since(t0 time.Time) int64 { return time.Since(t0).Milliseconds() }

// Render writes one line per check, with the fix under a failure.
func (r Report) Render(w io.Writer) {
	for _, c := range r.Checks {
		mark := map[Status]string{Pass: "ok  ", Warn: "warn", Fail: "FAIL", Skip: "skip"}[c.Status]
		line := fmt.Sprintf("%s %-9s %s", mark, c.Layer, c.Name)
		if c.Detail != "" {
			line += ": " + oneLine(c.Detail)
		}
		fmt.Fprintln(w, line)
		if c.Fix != "" && c.Status != Pass {
			fmt.Fprintf(w, "               fix: %s\n", oneLine(c.Fix))
		}
	}
}

// oneLine keeps a detail on one terminal line and strips control
// characters: details can quote what a hostile guest printed.
func oneLine(s string) string {
	s = termtext.Clean(strings.Join(strings.Fields(s), " "))
	if len(s) > 300 {
		s = strings.ToValidUTF8(s[:300], "") + "…"
	}
	return s
}
