package decisionlog

import (
	"cmp"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxBytes = 1 << 20
	DefaultInterval = 50 * time.Millisecond
	DefaultMaxWait  = 50 * time.Millisecond
)

// Config configures a Writer.
type Config struct {
	// Sinks receive every batch of whole lines, in order; typically the log
	// file (or stderr) and a logring.Ring. A sink's error is counted and
	// does not keep the batch from the other sinks. Writer never closes them.
	Sinks []io.Writer
	// Kept receive every line except allowed decisions (EmitAllowed):
	// blocks and refusals, their aggregates, warnings, diagnostics, the
	// overflow report. Typically a second, size-capped file and ring: a
	// guest's allowed traffic, which can be as fast as its rate limit,
	// rotates Sinks but cannot push a refusal out of Kept (refusals
	// themselves are held to RefusalsPerClient). Same error handling as
	// Sinks.
	Kept []io.Writer
	// MaxBytes bounds the lines queued for the sinks (DefaultMaxBytes if
	// <= 0). A full queue makes producers wait, see MaxWait.
	MaxBytes int
	// Interval is the longest a line waits before it is handed to the
	// sinks (DefaultInterval if <= 0); a queue half full goes at once.
	Interval time.Duration
	// MaxWait is how long a producer waits for room in a full queue before
	// its line is dropped (DefaultMaxWait if <= 0). Once a line has been
	// dropped, further lines are dropped without waiting until the queue
	// drains, so a stuck sink costs the filter one wait, not one per query.
	MaxWait time.Duration
	// Now is the clock of the overflow report line; nil means time.Now.
	Now func() time.Time
	// RefusalsPerClient is how many refusal lines (EmitRefusal) one client
	// may write per FloodInterval (DefaultRefusalsPerClient if 0, no limit
	// if < 0); the rest are counted into one "refusals aggregated" line per
	// client and interval.
	RefusalsPerClient int
	// FloodInterval is the aggregation interval (DefaultFloodInterval if <= 0).
	FloodInterval time.Duration
	// LocalPerClient is how many lines of answers that reached nothing
	// (EmitLocal: the healthcheck, which the filters answer themselves)
	// one client may write per FloodInterval (DefaultLocalPerClient if 0,
	// no limit if < 0); the rest are counted into one "local answers
	// aggregated" line per client and interval. Such lines are evidence of
	// nothing, and a guest sending them as fast as it may would rotate the
	// record of what it did reach out of the Sinks.
	LocalPerClient int
}

// DefaultLocalPerClient is Config.LocalPerClient's default.
const DefaultLocalPerClient = 5

// Stats are a Writer's counters since New.
type Stats struct {
	// Lines counts lines queued for the sinks.
	Lines uint64 `json:"lines"`
	// Dropped counts lines lost because the queue stayed full for MaxWait
	// or the Writer was closed. Each loss is also reported in the log by a
	// WARN line "decision log overflow" with the count.
	Dropped uint64 `json:"dropped"`
	// Waits counts the times a producer found the queue full and waited.
	Waits uint64 `json:"waits"`
	// WriteErrors counts failed writes of a batch to a sink.
	WriteErrors uint64 `json:"write_errors"`
	// Suppressed counts lines folded into "refusals aggregated" and "local
	// answers aggregated" lines.
	Suppressed uint64 `json:"suppressed"`
	// LastError is the last error of a sink (a full disk, say) and
	// LastErrorAt its time; empty once a later batch was written to every sink.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// Writer queues whole JSON lines and writes them to its sinks in batches
// from a goroutine of its own: one write per sink and batch instead of one
// per line, and no producer ever holds a lock across a sink's write.
//
// Lines are never lost silently: the queue is bounded, a producer that finds
// it full waits up to MaxWait, and only then is the line dropped, counted in
// Stats and reported in the log. Audit logs prefer a brief stall of the
// query path to a gap, but a stuck disk must not turn into a stuck filter.
//
// Writer is an io.Writer too, so that a slog JSON handler can share the
// stream (and its order) for the rarer diagnostic lines; each Write must
// hold whole lines, as slog's do.
type Writer struct {
	sinks    []io.Writer
	kept     []io.Writer
	maxBytes int
	maxWait  time.Duration
	interval time.Duration
	now      func() time.Time

	mu sync.Mutex
	// pending holds whole lines not yet taken by the flusher; len(pending)
	// exceeds maxBytes only by a line added to an empty queue.
	pending []byte
	// keptPending holds the lines of pending that also go to kept, in
	// order (all but allowed decisions); empty without kept.
	keptPending []byte
	// room is closed when the flusher takes pending; nil while no producer waits.
	room chan struct{}
	// dropping is set when a line was dropped and cleared when the flusher
	// takes pending: while set, producers finding the queue full do not wait.
	dropping bool
	// unreported counts drops not yet reported in the log.
	unreported uint64
	closed     bool

	// kick wakes the flusher: the first line of a batch starts its interval,
	// a queue half full or a waiting producer ends it early.
	kick             chan struct{}
	syncc            chan chan struct{}
	stop             chan struct{}
	done             chan struct{}
	spare, keptSpare []byte // owned by the flusher
	// err is the last error of a sink; written by the flusher only, read after done.
	err error

	lines, dropped, waits, writeErrors, suppressed atomic.Uint64
	// lastErr is the sink error of the last batch, nil when it was written.
	lastErr atomic.Pointer[sinkError]
	// flood aggregates refusal floods; nil when RefusalsPerClient < 0.
	flood *flood
	// local aggregates floods of local answers; nil when LocalPerClient < 0.
	local *flood
}

type sinkError struct {
	msg string
	at  time.Time
}

// New starts a Writer; Close stops it.
func New(cfg Config) *Writer {
	w := &Writer{
		sinks:    cfg.Sinks,
		kept:     cfg.Kept,
		maxBytes: cfg.MaxBytes,
		maxWait:  cfg.MaxWait,
		interval: cfg.Interval,
		now:      cfg.Now,
		kick:     make(chan struct{}, 1),
		syncc:    make(chan chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if w.maxBytes <= 0 {
		w.maxBytes = DefaultMaxBytes
	}
	if w.maxWait <= 0 {
		w.maxWait = DefaultMaxWait
	}
	if w.interval <= 0 {
		w.interval = DefaultInterval
	}
	if w.now == nil {
		w.now = time.Now
	}
	iv := cfg.FloodInterval
	if iv <= 0 {
		iv = DefaultFloodInterval
	}
	if budget := cfg.RefusalsPerClient; budget >= 0 {
		if budget == 0 {
			budget = DefaultRefusalsPerClient
		}
		w.flood = newFlood(budget, iv, "refusals aggregated")
	}
	if budget := cfg.LocalPerClient; budget >= 0 {
		if budget == 0 {
			budget = DefaultLocalPerClient
		}
		w.local = newFlood(budget, iv, "local answers aggregated")
	}
	go w.run()
	return w
}

// Emit queues l (adding the closing brace and newline) for every sink,
// Kept ones included, and recycles it. It waits at most MaxWait; see
// Writer.
func (w *Writer) Emit(l *Line) {
	b := l.finish()
	w.enqueue(b, b, 1)
	l.Free()
}

// EmitAllowed is Emit for the line of an allowed decision: it goes to
// Sinks only, not to Kept.
func (w *Writer) EmitAllowed(l *Line) {
	w.enqueue(l.finish(), nil, 1)
	l.Free()
}

// EmitBatch queues the finished lines of b, in order, as Emit and
// EmitAllowed would queue them one by one (a full queue drops them all,
// counted line by line), and empties b.
func (w *Writer) EmitBatch(b *Batch) {
	if b.n > 0 {
		w.enqueue(b.l.buf[:b.done], b.kept, b.n)
	}
	b.l.buf, b.kept, b.done, b.n = b.l.buf[:0], b.kept[:0], 0, 0
	if cap(b.l.buf) > maxBatchBuf || cap(b.kept) > maxBatchBuf {
		b.l.buf, b.kept = nil, nil // a batch of long lines (error texts); do not keep it
	}
}

// maxBatchBuf bounds the storage a Batch keeps from one use to the next.
const maxBatchBuf = 64 << 10

// EmitRefusal is Emit for the line of a refused request or query from
// client (its address; the zero Addr when unknown): within the client's budget it is
// written, past it counted under reason into the client's "refusals
// aggregated" line.
func (w *Writer) EmitRefusal(client netip.Addr, reason string, l *Line) {
	if !w.AdmitRefusal(client, reason) {
		l.Free()
		return
	}
	w.Emit(l)
}

// AdmitRefusal reports whether the line of a refusal from client may be
// written now, as EmitRefusal decides; when not, the refusal is counted
// under reason into the client's "refusals aggregated" line. A caller that
// asks first builds no line for a refusal that would not be written; one
// admitted goes out with Emit.
func (w *Writer) AdmitRefusal(client netip.Addr, reason string) bool {
	return w.within(w.flood, client, reason)
}

// within reports whether client's line is within its budget of f (nil:
// no budget), counting it as suppressed when not.
func (w *Writer) within(f *flood, client netip.Addr, reason string) bool {
	if f != nil && !f.admit(client, reason, w.now()) {
		w.suppressed.Add(1)
		return false
	}
	return true
}

// EmitLocal is EmitAllowed for the line of an answer the filters gave
// themselves (the healthcheck): within client's budget of such lines it is
// written, past it counted under reason into the client's "local answers
// aggregated" line, which goes to Sinks only, as the lines would have.
func (w *Writer) EmitLocal(client netip.Addr, reason string, l *Line) {
	if !w.AdmitLocal(client, reason) {
		l.Free()
		return
	}
	w.EmitAllowed(l)
}

// AdmitLocal is AdmitRefusal for the lines of EmitLocal.
func (w *Writer) AdmitLocal(client netip.Addr, reason string) bool {
	return w.within(w.local, client, reason)
}

// Write queues p, which must be whole lines ending in a newline. It never
// fails: a line that cannot be queued is counted as dropped.
func (w *Writer) Write(p []byte) (int, error) {
	w.enqueue(p, p, 1)
	return len(p), nil
}

// enqueue queues p, n whole lines, for Sinks, and kept, those of them
// that are not allowed decisions, for Kept. The bound counts pending, of
// which keptPending is a part.
func (w *Writer) enqueue(p, kept []byte, n int) {
	w.mu.Lock()
	if w.full(p) && !w.waitRoom(p) {
		w.unreported += uint64(n)
		w.mu.Unlock()
		w.dropped.Add(uint64(n))
		return
	}
	first := len(w.pending) == 0
	w.pending = append(w.pending, p...)
	if len(kept) > 0 && len(w.kept) > 0 {
		w.keptPending = append(w.keptPending, kept...)
	}
	half := len(w.pending) >= w.maxBytes/2
	w.mu.Unlock()
	w.lines.Add(uint64(n))
	if first || half {
		w.wake()
	}
}

// full reports whether p cannot be queued now. A line longer than maxBytes
// still goes into an empty queue. w.mu must be held.
func (w *Writer) full(p []byte) bool {
	return w.closed || (len(w.pending) > 0 && len(w.pending)+len(p) > w.maxBytes)
}

// waitRoom waits up to maxWait for room for p and reports whether there is
// some. w.mu is held on entry and on return.
func (w *Writer) waitRoom(p []byte) bool {
	if w.closed || w.dropping {
		return false
	}
	w.waits.Add(1)
	deadline := time.NewTimer(w.maxWait)
	defer deadline.Stop()
	for w.full(p) {
		if w.closed || w.dropping {
			return false
		}
		if w.room == nil {
			w.room = make(chan struct{})
		}
		room := w.room
		w.mu.Unlock()
		w.wake()
		select {
		case <-room:
			w.mu.Lock()
		case <-deadline.C:
			w.mu.Lock()
			if w.full(p) {
				w.dropping = true
				return false
			}
		}
	}
	return true
}

func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Sync returns once every line queued before the call has been written to
// the sinks (or Close has run).
func (w *Writer) Sync() {
	c := make(chan struct{})
	select {
	case w.syncc <- c:
		<-c
	case <-w.done:
	}
}

// Close writes what is queued and stops the Writer; later lines are
// dropped. It returns the last error of a sink, if any; it does not close
// the sinks.
func (w *Writer) Close() error {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
	w.mu.Unlock()
	<-w.done
	return w.err
}

// Stats returns the counters.
func (w *Writer) Stats() Stats {
	st := Stats{Lines: w.lines.Load(), Dropped: w.dropped.Load(), Waits: w.waits.Load(), WriteErrors: w.writeErrors.Load(), Suppressed: w.suppressed.Load()}
	if e := w.lastErr.Load(); e != nil {
		st.LastError, st.LastErrorAt = e.msg, e.at
	}
	return st
}

func (w *Writer) run() {
	defer close(w.done)
	t := time.NewTimer(w.interval)
	t.Stop()
	var floodTick <-chan time.Time
	if f := cmp.Or(w.flood, w.local); f != nil {
		tk := time.NewTicker(f.interval)
		defer tk.Stop()
		floodTick = tk.C
	}
	for {
		select {
		case <-floodTick:
			now := w.now()
			if w.flood != nil {
				for _, l := range w.flood.summaries(now) {
					w.enqueue(l, l, 1)
				}
			}
			if w.local != nil {
				for _, l := range w.local.summaries(now) {
					w.enqueue(l, nil, 1)
				}
			}
			continue
		case <-w.kick:
			if w.urgent() {
				break
			}
			// The first line of a batch: give the others the interval
			// to join it, unless the queue fills up first.
			t.Reset(w.interval)
			select {
			case <-t.C:
			case <-w.kick:
				t.Stop()
			case c := <-w.syncc:
				t.Stop()
				w.flush()
				close(c)
				continue
			case <-w.stop:
				t.Stop()
				w.flushFlood()
				w.flush()
				return
			}
		case c := <-w.syncc:
			w.flush()
			close(c)
			continue
		case <-w.stop:
			w.flushFlood()
			w.flush()
			return
		}
		w.flush()
	}
}

// flushFlood queues the aggregate lines still open, at Close.
func (w *Writer) flushFlood() {
	for _, f := range []*flood{w.flood, w.local} {
		if f == nil {
			continue
		}
		for _, l := range f.summaries(w.now().Add(f.interval)) {
			w.mu.Lock()
			w.pending = append(w.pending, l...)
			if len(w.kept) > 0 && f == w.flood {
				w.keptPending = append(w.keptPending, l...)
			}
			w.mu.Unlock()
		}
	}
}

// urgent reports whether the queue is half full or a producer waits for room.
func (w *Writer) urgent() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending) >= w.maxBytes/2 || w.room != nil
}

// flush hands the queued lines to the sinks. Only the flusher goroutine calls it.
func (w *Writer) flush() {
	w.mu.Lock()
	batch, kept := w.pending, w.keptPending
	w.pending, w.keptPending = w.spare[:0], w.keptSpare[:0]
	if w.room != nil {
		close(w.room)
		w.room = nil
	}
	w.dropping = false
	lost := w.unreported
	w.unreported = 0
	w.mu.Unlock()
	if lost > 0 {
		l := NewLine(w.now(), slog.LevelWarn, "decision log overflow")
		l.Int("dropped", int64(lost)).Int("max_bytes", int64(w.maxBytes))
		b := l.finish()
		batch = append(batch, b...)
		if len(w.kept) > 0 {
			kept = append(kept, b...)
		}
		l.Free()
	}
	if len(batch) > 0 {
		var failed *sinkError
		write := func(sinks []io.Writer, b []byte) {
			if len(b) == 0 {
				return
			}
			for _, s := range sinks {
				if _, err := s.Write(b); err != nil {
					w.writeErrors.Add(1)
					w.err = err
					failed = &sinkError{msg: err.Error(), at: w.now()}
				}
			}
		}
		write(w.sinks, batch)
		write(w.kept, kept)
		w.lastErr.Store(failed)
	}
	w.spare, w.keptSpare = reuse(batch, w.maxBytes), reuse(kept, w.maxBytes)
}

// reuse returns b emptied for the next batch, or nil after a burst of
// large lines (not to be kept).
func reuse(b []byte, maxBytes int) []byte {
	if cap(b) > 2*maxBytes {
		return nil
	}
	return b[:0]
}
