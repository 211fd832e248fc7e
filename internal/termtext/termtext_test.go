package termtext

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

// hostile are the sequences a guest or a repository would print to take
// over the operator's terminal.
var hostile = []string{
	"\x1b]0;pwned\x07",           // retitle
	"\x1b]52;c;cm0gLXJmIH4K\x07", // OSC 52: write the clipboard
	"\x1b[2K\x1b[1A",             // erase the line, cursor up
	"\u009b31m",                  // 8-bit CSI, UTF-8 encoded
	"\x9b31m",                    // 8-bit CSI, raw byte
	"ok\rblocked",                // overwrite in place
	"a\bb",                       // backspace
	"\u202eexe.txt",              // right-to-left override
	"\u2066x\u2069",              // isolates
	"\x7f",                       // DEL
	"\x1bP+q\x1b\\",              // DCS
}

func noControl(t *testing.T, what, got string, allowed string) {
	t.Helper()
	for _, r := range got {
		if Unsafe(r) && !strings.ContainsRune(allowed, r) {
			t.Errorf("%s: %q holds %U", what, got, r)
		}
	}
	if strings.ContainsRune(got, 0xfffd) {
		t.Errorf("%s: %q holds invalid UTF-8", what, got)
	}
}

func TestCleanEscapesEverythingATerminalActsOn(t *testing.T) {
	for _, s := range hostile {
		got := Clean(s)
		noControl(t, "Clean", got, "")
		if Check(got) != nil {
			t.Errorf("Clean(%q) = %q, still unsafe: %v", s, got, Check(got))
		}
		if Check(s) == nil {
			t.Errorf("Check(%q) = nil", s)
		}
	}
	if got := Clean("plain ünïcode, tabs\tand lines\n"); got != `plain ünïcode, tabs\tand lines\n` {
		t.Errorf("Clean = %q", got)
	}
	if got := Clean("x\x1b]0;t\x07y"); got != `x\x1b]0;t\x07y` {
		t.Errorf("Clean = %q", got)
	}
}

func TestWriterKeepsLinesAndEscapesTheRest(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	for _, s := range hostile {
		w.Write([]byte(s + "\n"))
	}
	w.Flush()
	noControl(t, "Writer", b.String(), "\n")
	if !strings.Contains(b.String(), "ok\nblocked\n") {
		t.Errorf("a lone CR is not a new line: %q", b.String())
	}

	// CRLF is one newline; tabs stay; a rune split across writes survives.
	b.Reset()
	w = NewWriter(&b)
	in := []byte("a\r\nb\tü\x1b[31mc\r")
	for i := range in {
		w.Write(in[i : i+1])
	}
	w.Flush()
	if got, want := b.String(), "a\nb\tü\\x1b[31mc\n"; got != want {
		t.Errorf("byte by byte: %q, want %q", got, want)
	}
	b.Reset()
	w = NewWriter(&b)
	w.Write([]byte("x\xc3"))
	w.Flush()
	if got := b.String(); got != `x\xc3` {
		t.Errorf("truncated rune: %q", got)
	}
}

// TestJSONStaysJSONAndSafe: log lines and --json output keep their meaning
// and lose every rune a terminal would act on.
func TestJSONStaysJSONAndSafe(t *testing.T) {
	in := []byte(`{"host":"a` + "\u009b" + `31m","path":"/` + "\u202e" + `gpj.exe\u001b","n":1,"del":"` + "\x7f" + `"}` + "\n")
	out := JSON(in)
	var a, b map[string]any
	if err := json.Unmarshal(in, &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &b); err != nil {
		t.Fatalf("no longer JSON: %v: %s", err, out)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("meaning changed: %v != %v", a, b)
	}
	for _, r := range string(out) {
		if Unsafe(r) && r != '\n' {
			t.Errorf("%q still holds %U", out, r)
		}
	}
	plain := []byte(`{"a":"ü ok"}` + "\n")
	if got := JSON(plain); string(got) != string(plain) {
		t.Errorf("JSON(%q) = %q", plain, got)
	}
}

// FuzzTermtext: whatever the bytes, Clean's result is safe, the Writer's
// output holds no unsafe rune but newline and tab however the input is
// split across writes, and JSON keeps valid JSON's meaning.
func FuzzTermtext(f *testing.F) {
	for _, s := range hostile {
		f.Add([]byte(s), uint8(3))
	}
	f.Add([]byte(`{"a":"\u001b","b":"`+"\u009b\u202e"+`"}`), uint8(1))
	f.Fuzz(func(t *testing.T, in []byte, split uint8) {
		if err := Check(Clean(string(in))); err != nil {
			t.Fatalf("Clean(%q) = %q: %v", in, Clean(string(in)), err)
		}
		var b bytes.Buffer
		w := NewWriter(&b)
		step := int(split%7) + 1
		for i := 0; i < len(in); i += step {
			w.Write(in[i:min(i+step, len(in))])
		}
		w.Flush()
		for _, line := range strings.Split(b.String(), "\n") {
			if err := Check(strings.ReplaceAll(line, "\t", " ")); err != nil {
				t.Fatalf("Writer(%q) line %q: %v", in, line, err)
			}
		}
		var v1, v2 any
		if json.Unmarshal(in, &v1) == nil {
			out := JSON(in)
			if err := json.Unmarshal(out, &v2); err != nil || !reflect.DeepEqual(v1, v2) {
				t.Fatalf("JSON(%q) = %q: %v, meaning %v != %v", in, out, err, v1, v2)
			}
		}
	})
}

// TestIsTerminal: a pty is a terminal; a pipe, a file and a buffer are not
// (they get the guest's bytes as they are).
func TestIsTerminal(t *testing.T) {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer ptmx.Close()
	if !IsTerminal(ptmx) {
		t.Error("a pty is not a terminal")
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	f, _ := os.CreateTemp(t.TempDir(), "x")
	defer f.Close()
	for _, x := range []io.Writer{w, f, &bytes.Buffer{}} {
		if IsTerminal(x) {
			t.Errorf("%T is a terminal", x)
		}
	}
}
