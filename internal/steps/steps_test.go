package steps

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// recorder builds steps that log what ran, in order.
type recorder struct{ log []string }

func (r *recorder) step(name string, doErr, undoErr error) Step {
	return Step{
		Name: name,
		Do: func(context.Context) error {
			r.log = append(r.log, "do "+name)
			return doErr
		},
		Undo: func(context.Context) error {
			r.log = append(r.log, "undo "+name)
			return undoErr
		},
	}
}

func TestRunsInOrder(t *testing.T) {
	var r recorder
	timings, err := Runner{}.Run(context.Background(), []Step{r.step("a", nil, nil), r.step("b", nil, nil), r.step("c", nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"do a", "do b", "do c"}; !slices.Equal(r.log, want) {
		t.Errorf("ran %v, want %v (and no undo on success)", r.log, want)
	}
	var names []string
	for _, tm := range timings {
		names = append(names, tm.Step)
	}
	if want := []string{"a", "b", "c"}; !slices.Equal(names, want) {
		t.Errorf("timings for %v, want %v", names, want)
	}
}

func TestFailureUndoesCompletedInReverse(t *testing.T) {
	var r recorder
	boom := errors.New("boom")
	list := []Step{r.step("a", nil, nil), {Name: "no undo", Do: func(context.Context) error { r.log = append(r.log, "do no undo"); return nil }},
		r.step("b", nil, nil), r.step("c", boom, nil), r.step("d", nil, nil)}
	_, err := Runner{Prefix: "making x"}.Run(context.Background(), list)
	// c failed: its own undo does not run, nor does d at all.
	if want := []string{"do a", "do no undo", "do b", "do c", "undo b", "undo a"}; !slices.Equal(r.log, want) {
		t.Errorf("ran %v, want %v", r.log, want)
	}
	var se *Error
	if !errors.As(err, &se) || se.Step != "c" || !errors.Is(err, boom) {
		t.Fatalf("err = %#v, want an *Error of step c wrapping the cause", err)
	}
	if want := []string{"b", "a"}; !slices.Equal(se.Undone, want) {
		t.Errorf("undone %v, want %v (steps without an undo are not listed)", se.Undone, want)
	}
	if got, want := err.Error(), "making x: boom"; got != want {
		t.Errorf("message %q, want %q (the prefix once)", got, want)
	}
}

type factErr struct{ what string }

func (e *factErr) Error() string { return e.what }

func TestUndoErrorsJoinTheCause(t *testing.T) {
	var r recorder
	cause := &factErr{"the cause"}
	ua, ub := errors.New("ua broke"), errors.New("ub broke")
	_, err := Runner{}.Run(context.Background(), []Step{r.step("a", nil, ua), r.step("b", nil, ub), r.step("c", cause, nil)})
	if want := []string{"do a", "do b", "do c", "undo b", "undo a"}; !slices.Equal(r.log, want) {
		t.Errorf("ran %v, want %v (a failed undo does not stop the others)", r.log, want)
	}
	var fe *factErr
	if !errors.As(err, &fe) || !errors.Is(err, ua) || !errors.Is(err, ub) {
		t.Errorf("err = %v: want the typed cause and both undo errors reachable", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "the cause (and rolling back: ") || !strings.Contains(msg, "undo b: ub broke") || !strings.Contains(msg, "undo a: ua broke") {
		t.Errorf("message %q: want the cause, then each failed undo by step", msg)
	}
	if se := (*Error)(nil); errors.As(err, &se) && len(se.Undone) != 0 {
		t.Errorf("undone %v: a failed undo is not undone", se.Undone)
	}
	if strings.Index(msg, "undo b") > strings.Index(msg, "undo a") {
		t.Errorf("message %q: want the undo errors in the order they ran", msg)
	}
}

func TestCancellationStopsAndUndoes(t *testing.T) {
	var r recorder
	ctx, cancel := context.WithCancel(context.Background())
	var undoCtxErr error
	list := []Step{
		{Name: "a", Do: func(context.Context) error { r.log = append(r.log, "do a"); return nil },
			Undo: func(ctx context.Context) error { undoCtxErr = ctx.Err(); r.log = append(r.log, "undo a"); return nil }},
		{Name: "cancel", Do: func(context.Context) error { r.log = append(r.log, "do cancel"); cancel(); return nil }},
		r.step("never", nil, nil),
	}
	_, err := Runner{}.Run(ctx, list)
	if want := []string{"do a", "do cancel", "undo a"}; !slices.Equal(r.log, want) {
		t.Errorf("ran %v, want %v", r.log, want)
	}
	var se *Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &se) || se.Step != "never" {
		t.Errorf("err = %v, want context.Canceled at step never", err)
	}
	if undoCtxErr != nil {
		t.Errorf("undo ran with a cancelled context (%v); a cancelled operation must still roll back", undoCtxErr)
	}
}

// fakeClock advances by one second per reading.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { c.t = c.t.Add(time.Second); return c.t }

func TestProgressReportsEveryPhase(t *testing.T) {
	var r recorder
	var got []string
	c := &fakeClock{}
	run := Runner{Now: c.now, Progress: func(ev Event) {
		got = append(got, fmt.Sprintf("%d/%d %s %s %s %v", ev.Index, ev.Total, ev.Step, ev.Phase, ev.Elapsed, ev.Err))
	}}
	boom, ub := errors.New("boom"), errors.New("ub")
	timings, _ := run.Run(context.Background(), []Step{r.step("a", nil, nil), r.step("b", nil, ub), r.step("c", boom, nil)})
	want := []string{
		"0/3 a started 0s <nil>", "0/3 a done 1s <nil>",
		"1/3 b started 0s <nil>", "1/3 b done 1s <nil>",
		"2/3 c started 0s <nil>", "2/3 c failed 1s boom",
		"1/3 b undo failed 1s ub", "0/3 a undone 1s <nil>",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(timings) != 2 || timings[0] != (Timing{"a", time.Second}) || timings[1] != (Timing{"b", time.Second}) {
		t.Errorf("timings = %v, want a and b at 1s each", timings)
	}
}

// BenchmarkRun measures the runner's own cost per step (no-op steps,
// with a progress callback, as create's 16 steps run).
func BenchmarkRun(b *testing.B) {
	list := make([]Step, 16)
	for i := range list {
		list[i] = Step{Name: fmt.Sprint("step ", i), Do: func(context.Context) error { return nil }, Undo: func(context.Context) error { return nil }}
	}
	events := 0
	r := Runner{Prefix: "creating dev", Progress: func(Event) { events++ }}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Run(ctx, list); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(list)), "ns/step")
}
