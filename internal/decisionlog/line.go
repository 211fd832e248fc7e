// Package decisionlog writes the filters' per-decision JSON lines fast: an
// append-only encoder builds each line without reflection or allocation, and
// a Writer hands batches of lines to the sinks (log file, in-memory ring)
// from a goroutine of its own, so a query never waits on a disk.
package decisionlog

import (
	"log/slog"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// Line is one JSON object under construction. Fields appear in the order
// they are added, after "time", "level" and "msg", exactly as log/slog's
// JSON handler would write them, so readers of the logs see one format
// whichever way a line was made. A Line is not safe for concurrent use; it
// is recycled by Writer.Emit or Free and must not be used afterwards.
type Line struct {
	buf []byte
}

// maxPooled bounds the capacity of a recycled Line: a rare huge line (a
// long error text) should not pin its buffer in the pool.
const maxPooled = 8 << 10

var linePool = sync.Pool{New: func() any { return &Line{buf: make([]byte, 0, 512)} }}

// NewLine starts a line {"time":t,"level":level,"msg":msg with t in
// RFC 3339 with nanoseconds, as slog writes it.
func NewLine(t time.Time, level slog.Level, msg string) *Line {
	l := linePool.Get().(*Line)
	l.buf = appendHead(l.buf[:0], t, level, msg)
	return l
}

// appendHead appends the start of a line, {"time":t,"level":level,"msg":msg.
func appendHead(b []byte, t time.Time, level slog.Level, msg string) []byte {
	b = append(b, `{"time":"`...)
	b = appendTime(b, t)
	b = append(b, `","level":`...)
	if level == slog.LevelInfo {
		b = append(b, `"INFO"`...)
	} else {
		b = appendString(b, level.String())
	}
	b = append(b, `,"msg":`...)
	return appendString(b, msg)
}

// Batch gathers the lines of a run of decisions made together (the
// datagrams of one read) so that they are queued together, with one lock
// and at most one wake-up of the writer for them all. Each line is whole
// and written as Writer.Emit would write it. A Batch is not safe for
// concurrent use; its zero value is empty.
type Batch struct {
	l Line // buf: the finished lines, then the one being built
	// kept is a copy of the finished lines that go to Kept (all but
	// allowed decisions), in order.
	kept []byte
	// done is the end of the last finished line: a line started and not
	// finished is never queued.
	done, n int
}

// NewLine starts a line at the end of b, as NewLine does. Its fields are
// added to the returned Line, which Done or DoneAllowed finishes; the Line
// must not be used after that.
func (b *Batch) NewLine(t time.Time, level slog.Level, msg string) *Line {
	b.l.buf = appendHead(b.l.buf[:b.done], t, level, msg)
	return &b.l
}

// Done finishes the line NewLine started, for every sink (as Emit).
func (b *Batch) Done() {
	start := b.done
	b.DoneAllowed()
	b.kept = append(b.kept, b.l.buf[start:b.done]...)
}

// DoneAllowed finishes the line NewLine started, the line of an allowed
// decision: for Sinks only (as EmitAllowed).
func (b *Batch) DoneAllowed() {
	b.l.buf = append(b.l.buf, '}', '\n')
	b.done, b.n = len(b.l.buf), b.n+1
}

// Len is the number of finished lines in b.
func (b *Batch) Len() int { return b.n }

// stamp is the formatted second of a time: lines come thousands a second,
// and but for the fraction the time of each is written the same.
type stamp struct {
	sec  int64
	loc  *time.Location
	date []byte // "2006-01-02T15:04:05"
	zone []byte // "Z07:00": "Z" or "+01:00"
}

var lastStamp atomic.Pointer[stamp]

// appendTime appends t as t.AppendFormat(b, time.RFC3339Nano) does (the
// fraction without trailing zeros, none for a whole second), formatting
// the second only when it is not the last line's.
func appendTime(b []byte, t time.Time) []byte {
	sec, loc := t.Unix(), t.Location()
	st := lastStamp.Load()
	if st == nil || st.sec != sec || st.loc != loc {
		st = &stamp{sec: sec, loc: loc, date: t.AppendFormat(nil, "2006-01-02T15:04:05"), zone: t.AppendFormat(nil, "Z07:00")}
		lastStamp.Store(st)
	}
	b = append(b, st.date...)
	if ns := t.Nanosecond(); ns != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := len(frac)
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return append(b, st.zone...)
}

// Free recycles l without writing it.
func (l *Line) Free() {
	if cap(l.buf) > maxPooled {
		return
	}
	l.buf = l.buf[:0]
	linePool.Put(l)
}

func (l *Line) key(k string) {
	l.buf = append(l.buf, ',')
	l.buf = appendString(l.buf, k)
	l.buf = append(l.buf, ':')
}

// String adds a string field. Any bytes are accepted: invalid UTF-8 becomes
// U+FFFD and control characters are escaped, so a name chosen by a guest
// can neither break the line nor forge a field.
func (l *Line) String(k, v string) *Line {
	l.key(k)
	l.buf = appendString(l.buf, v)
	return l
}

// Bool adds a boolean field.
func (l *Line) Bool(k string, v bool) *Line {
	l.key(k)
	l.buf = strconv.AppendBool(l.buf, v)
	return l
}

// Int adds an integer field.
func (l *Line) Int(k string, v int64) *Line {
	l.key(k)
	l.buf = strconv.AppendInt(l.buf, v, 10)
	return l
}

// Float adds a number field formatted as encoding/json (and so slog) does.
// JSON has no NaN or infinities; those are written as the strings "NaN",
// "+Inf" and "-Inf" so that the line stays valid.
func (l *Line) Float(k string, v float64) *Line {
	l.key(k)
	l.buf = appendFloat(l.buf, v)
	return l
}

// Addr adds an IP address field, as netip.Addr.String writes it.
func (l *Line) Addr(k string, a netip.Addr) *Line {
	if !a.IsValid() || a.Zone() != "" {
		// Rare; a zone is an interface name and could hold anything.
		return l.String(k, a.String())
	}
	l.key(k)
	l.buf = append(l.buf, '"')
	l.buf = a.AppendTo(l.buf)
	l.buf = append(l.buf, '"')
	return l
}

// Fields is a run of fields encoded once, to be added to many lines with
// Line.Fields: the part of a line that is the same from line to line.
type Fields struct{ b []byte }

// Encode returns the fields fill adds to a line, encoded as it adds them.
func Encode(fill func(*Line)) Fields {
	l := &Line{}
	fill(l)
	return Fields{b: l.buf}
}

// Fields adds the fields of f, as if the calls that encoded them were made
// on l.
func (l *Line) Fields(f Fields) *Line {
	l.buf = append(l.buf, f.b...)
	return l
}

// finish closes the object and returns the whole line with its newline.
func (l *Line) finish() []byte {
	l.buf = append(l.buf, '}', '\n')
	return l.buf
}

// appendFloat is encoding/json's float64 encoding.
func appendFloat(b []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(b, `"NaN"`...)
	case math.IsInf(f, 1):
		return append(b, `"+Inf"`...)
	case math.IsInf(f, -1):
		return append(b, `"-Inf"`...)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

const hex = "0123456789abcdef"

// safe reports the ASCII bytes that need no escaping inside a JSON string.
var safe = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// appendString appends s as a JSON string (RFC 8259), escaping exactly as
// log/slog's JSON handler does: \" \\ \n \r \t, \u00XX for the other
// control characters, \u2028 and \u2029 (for JavaScript embedders), and
// \ufffd for each byte that is not part of valid UTF-8.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
