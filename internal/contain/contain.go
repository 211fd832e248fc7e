// Package contain reports panics that a filter recovered in the goroutine
// serving one guest connection, query or request, so that one bad input
// costs that connection and not the daemon every other one depends on.
//
// The recovering itself stays at each site (recover works only in the
// deferred function itself), which also closes exactly what that goroutine
// served:
//
//	defer func() {
//		if v := recover(); v != nil {
//			p.panics.Report("http connection", v, "client", remote)
//			c.Close()
//		}
//	}()
package contain

import (
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

const (
	// maxStack bounds the stack written with a report.
	maxStack = 8 << 10
	// A guest that can trigger a panic at will can trigger it in a loop:
	// at most reportBurst lines, then one per reportEvery, reach the log
	// (the daemon's diagnostics are not size-capped); the rest are counted
	// and the next line says how many.
	reportEvery = time.Second
	reportBurst = 5
)

// Reporter logs and counts recovered panics. Make one with New; a nil
// Reporter reports nothing (tests of the parts that take one).
type Reporter struct {
	log   *slog.Logger
	lim   *rate.Limiter
	count atomic.Uint64

	mu         sync.Mutex
	suppressed uint64 // reports not logged since the last line
}

// New returns a Reporter that writes to log (nil discards).
func New(log *slog.Logger) *Reporter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Reporter{log: log, lim: rate.NewLimiter(rate.Every(reportEvery), reportBurst)}
}

// Report records a panic v recovered while serving what ("http
// connection", "dns query"); attrs name the guest (key, value pairs as for
// slog). It logs at ERROR with the stack of the recovering goroutine.
func (r *Reporter) Report(what string, v any, attrs ...any) {
	if r == nil {
		return
	}
	// Counted once logged: a reader that sees the count finds the line.
	defer r.count.Add(1)
	r.mu.Lock()
	if !r.lim.Allow() {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.suppressed = 0
	r.mu.Unlock()
	stack := debug.Stack()
	if len(stack) > maxStack {
		stack = stack[:maxStack]
	}
	args := append([]any{"what", what, "panic", fmt.Sprint(v)}, attrs...)
	if suppressed > 0 {
		args = append(args, "unlogged_before", suppressed)
	}
	args = append(args, "stack", string(stack))
	// The message is fixed so that the line is easy to find; what says
	// which one thing was ended.
	r.log.Error("panic contained", args...)
}

// Count is the number of panics reported since New.
func (r *Reporter) Count() uint64 {
	if r == nil {
		return 0
	}
	return r.count.Load()
}
