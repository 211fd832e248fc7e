// Package termtext makes text someone else chose (a hostile guest's output,
// a repository's abox.yaml) safe to show on the operator's terminal: no
// escape sequence, no 8-bit control, no bidirectional override may reach it,
// since those can retitle the terminal, write the clipboard (OSC 52), move
// the cursor to overwrite what was printed before, or reorder what a line
// appears to say.
package termtext

import (
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Unsafe reports whether r must never reach a terminal as itself: C0 and C1
// controls (ESC, CSI, OSC, BEL, CR, backspace...), DEL, the line and
// paragraph separators and the bidirectional controls. Tab and newline count
// as unsafe too; Writer lets them through where lines are expected.
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Bidi_Control, r)
}

// Check returns an error naming the first unsafe character of s (or its
// invalid UTF-8), and nil when s is safe to print as it is.
func Check(s string) error {
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		if r == utf8.RuneError && size <= 1 {
			return fmt.Errorf("byte %d is not valid UTF-8", i)
		}
		if Unsafe(r) {
			return fmt.Errorf("it holds the control character %U at byte %d", r, i)
		}
	}
	return nil
}

// Clean returns s on one line with every unsafe character written out as
// an escape (\x1b, \u202e, \n), so the operator sees that something was
// there without the terminal acting on it.
func Clean(s string) string {
	if Check(s) == nil {
		return s
	}
	var b strings.Builder
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		b.WriteString(escape(r, s[i:i+size]))
	}
	return b.String()
}

// escape is r (whose encoding is raw) as printed by Clean and Writer.
func escape(r rune, raw string) string {
	switch {
	case r == utf8.RuneError && len(raw) <= 1:
		return fmt.Sprintf(`\x%02x`, raw[0])
	case r == '\n':
		return `\n`
	case r == '\t':
		return `\t`
	case r == '\r':
		return `\r`
	case r < 0x100 && Unsafe(r):
		return fmt.Sprintf(`\x%02x`, r)
	case Unsafe(r):
		return fmt.Sprintf(`\u%04x`, r)
	}
	return raw
}

// Writer passes a stream of lines (a guest program's output) to W with
// newlines and tabs kept, a carriage return before a newline dropped, a
// lone carriage return turned into a newline (so nothing printed can be
// overwritten in place), and every other unsafe character escaped as Clean
// does. A UTF-8 sequence split across writes is reassembled.
type Writer struct {
	W       io.Writer
	pending []byte // an incomplete UTF-8 sequence from the last write
	cr      bool   // the last byte written was a carriage return
	out     []byte
}

// NewWriter returns a Writer onto w.
func NewWriter(w io.Writer) *Writer { return &Writer{W: w} }

// Write cleans p and writes it; it reports len(p) when W took everything.
func (t *Writer) Write(p []byte) (int, error) {
	buf := p
	if len(t.pending) > 0 {
		buf = append(t.pending, p...)
		t.pending = nil
	}
	t.out = t.out[:0]
	for i := 0; i < len(buf); {
		r, size := utf8.DecodeRune(buf[i:])
		if r == utf8.RuneError && size <= 1 && !utf8.FullRune(buf[i:]) {
			t.pending = append([]byte(nil), buf[i:]...)
			break
		}
		if t.cr {
			t.cr = false
			if r != '\n' {
				t.out = append(t.out, '\n')
			}
		}
		switch r {
		case '\n', '\t':
			t.out = append(t.out, byte(r))
		case '\r':
			t.cr = true
		default:
			t.out = append(t.out, escape(r, string(buf[i:i+size]))...)
		}
		i += size
	}
	if _, err := t.W.Write(t.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what an incomplete last write held back (an unfinished
// UTF-8 sequence, escaped; a trailing carriage return, as a newline).
func (t *Writer) Flush() error {
	var out []byte
	for _, c := range t.pending {
		out = append(out, fmt.Sprintf(`\x%02x`, c)...)
	}
	if t.cr {
		out = append(out, '\n')
	}
	t.pending, t.cr = nil, false
	if len(out) == 0 {
		return nil
	}
	_, err := t.W.Write(out)
	return err
}

// JSON returns JSON text with every rune a terminal acts on that JSON
// leaves as it is (DEL, the C1 controls, the bidirectional controls)
// written as a \uXXXX escape, and so is any stray C0 control or invalid
// byte; a carriage return, whitespace in valid JSON, becomes a space. Valid
// JSON stays valid and means the same: the escaped runes can only stand
// inside its strings, where the escape is their JSON spelling.
func JSON(b []byte) []byte {
	clean := true
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 || Unsafe(r) && r != '\n' && r != '\t' {
			clean = false
			break
		}
		i += size
	}
	if clean {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			out = append(out, `\ufffd`...)
		case r == '\r':
			// Only whitespace in valid JSON (inside a string it is
			// escaped already).
			out = append(out, ' ')
		case Unsafe(r) && r != '\n' && r != '\t':
			out = fmt.Appendf(out, `\u%04x`, r)
		default:
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}

// IsTerminal reports whether w is a terminal (a character device file such
// as the operator's tty), where foreign text must be made safe; a pipe or a
// regular file gets the bytes as they are.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
