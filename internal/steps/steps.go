// Package steps runs an operation as a list of named steps, each with an
// optional undo: in order, reporting each step's progress and duration,
// and on failure or cancellation undoing the completed ones in reverse.
package steps

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Step is one named part of an operation.
type Step struct {
	// Name says what the step does, in a few lowercase words ("disk
	// overlay"); events and errors carry it.
	Name string
	// Do does the step. A Do that fails must leave nothing of its own
	// behind: its Undo is not run, only those of the steps before it.
	Do func(ctx context.Context) error
	// Undo reverts a completed Do; nil means there is nothing to revert.
	// It runs with a context that is never cancelled (a cancelled
	// operation is still rolled back), and only after Do succeeded.
	Undo func(ctx context.Context) error
}

// Phase is where a step is in its life.
type Phase int

const (
	Started    Phase = iota // Do begins
	Done                    // Do returned nil
	Failed                  // Do returned an error, or the context ended before it
	Undone                  // Undo returned nil
	UndoFailed              // Undo returned an error
)

func (p Phase) String() string {
	switch p {
	case Started:
		return "started"
	case Done:
		return "done"
	case Failed:
		return "failed"
	case Undone:
		return "undone"
	case UndoFailed:
		return "undo failed"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// Event reports one step's progress.
type Event struct {
	Step  string
	Index int // of the step in the list, from 0
	Total int // steps in the list
	Phase Phase
	// Elapsed is how long Do (for Done and Failed) or Undo (for Undone
	// and UndoFailed) took; 0 for Started.
	Elapsed time.Duration
	// Err is the error of Failed and UndoFailed events.
	Err error
}

// Timing is how long one completed step took.
type Timing struct {
	Step     string        `json:"step"`
	Duration time.Duration `json:"duration_ns"`
}

// Runner runs step lists. The zero value is ready to use.
type Runner struct {
	// Prefix, when set, begins the message of every error Run returns
	// ("creating dev"), so the steps need not repeat it.
	Prefix string
	// Progress receives every event as it happens; optional. It runs on
	// Run's goroutine and must not block for long.
	Progress func(Event)
	// Now is the clock durations are measured with; nil is time.Now.
	Now func() time.Time
}

// Error is a failed run: which step failed and why, and what went wrong
// while undoing the steps before it.
type Error struct {
	Prefix string
	// Step names the step that failed.
	Step string
	// Err is why; for a cancelled run, the context's error.
	Err error
	// Undo holds one error per undo that failed ("undo NAME: ..."), in
	// the order they ran (the reverse of the steps').
	Undo []error
	// Undone names the steps whose undo ran without error, in that order.
	Undone []string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Prefix != "" {
		b.WriteString(e.Prefix)
		b.WriteString(": ")
	}
	b.WriteString(e.Err.Error())
	if len(e.Undo) > 0 {
		fmt.Fprintf(&b, " (and rolling back: %v)", errors.Join(e.Undo...))
	}
	return b.String()
}

// Unwrap gives the cause and the undo errors, so errors.Is and errors.As
// see all of them (the cause first).
func (e *Error) Unwrap() []error { return append([]error{e.Err}, e.Undo...) }

// Run runs list in order and returns the durations of the steps that
// completed. When a step fails, or ctx ends before a step begins, the
// completed steps are undone in reverse and the error is an *Error.
func (r Runner) Run(ctx context.Context, list []Step) ([]Timing, error) {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	emit := func(ev Event) {
		if r.Progress != nil {
			ev.Total = len(list)
			r.Progress(ev)
		}
	}
	timings := make([]Timing, 0, len(list))
	for i, s := range list {
		err := ctx.Err()
		var took time.Duration
		if err == nil {
			emit(Event{Step: s.Name, Index: i, Phase: Started})
			start := now()
			err = s.Do(ctx)
			took = now().Sub(start)
		}
		if err != nil {
			emit(Event{Step: s.Name, Index: i, Phase: Failed, Elapsed: took, Err: err})
			e := &Error{Prefix: r.Prefix, Step: s.Name, Err: err}
			e.Undone, e.Undo = r.undo(ctx, list[:i], emit, now)
			return timings, e
		}
		emit(Event{Step: s.Name, Index: i, Phase: Done, Elapsed: took})
		timings = append(timings, Timing{Step: s.Name, Duration: took})
	}
	return timings, nil
}

// undo reverts done, last first, and returns the names of the steps it
// undid and the errors of the undos that failed; each runs even when
// another failed.
func (r Runner) undo(ctx context.Context, done []Step, emit func(Event), now func() time.Time) (undone []string, errs []error) {
	ctx = context.WithoutCancel(ctx)
	for i := len(done) - 1; i >= 0; i-- {
		s := done[i]
		if s.Undo == nil {
			continue
		}
		start := now()
		err := s.Undo(ctx)
		took := now().Sub(start)
		if err != nil {
			emit(Event{Step: s.Name, Index: i, Phase: UndoFailed, Elapsed: took, Err: err})
			errs = append(errs, fmt.Errorf("undo %s: %w", s.Name, err))
			continue
		}
		emit(Event{Step: s.Name, Index: i, Phase: Undone, Elapsed: took})
		undone = append(undone, s.Name)
	}
	return undone, errs
}
