package gitpush

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

var (
	oidA  = strings.Repeat("a", 40)
	oidB  = strings.Repeat("b", 40)
	zero  = strings.Repeat("0", 40)
	oidA2 = strings.Repeat("a", 64)
	zero2 = strings.Repeat("0", 64)
)

func pktS(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

const caps = "report-status side-band-64k agent=git/2.39.5"

func body(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		if l == "0000" {
			b.WriteString(l)
			continue
		}
		b.WriteString(pktS(l))
	}
	return b.String()
}

func TestRead(t *testing.T) {
	cases := []struct {
		name string
		body string
		want []Command
		err  error // nil: read whole
	}{
		{"update", body(oidA+" "+oidB+" refs/heads/agent/x\x00"+caps, "0000") + "PACK...", []Command{{oidA, oidB, "refs/heads/agent/x"}}, nil},
		{"several, LF ended", body(zero+" "+oidB+" refs/heads/a\x00"+caps+"\n", oidA+" "+zero+" refs/heads/b\n", "0000"), []Command{{zero, oidB, "refs/heads/a"}, {oidA, zero, "refs/heads/b"}}, nil},
		{"sha256", body(zero2+" "+oidA2+" refs/heads/a\x00report-status object-format=sha256", "0000"), []Command{{zero2, oidA2, "refs/heads/a"}}, nil},
		{"sha1 ids in a sha256 push", body(zero+" "+oidA+" refs/heads/a\x00report-status object-format=sha256", "0000"), nil, ErrUnreadable},
		{"shallow first", body("shallow "+oidA, oidA+" "+oidB+" refs/heads/a\x00"+caps, "0000"), []Command{{oidA, oidB, "refs/heads/a"}}, nil},
		{"probe", "0000", nil, nil},
		{"no flush", body(oidA + " " + oidB + " refs/heads/a\x00" + caps), nil, ErrUnreadable},
		{"cut in a pkt-line", body(oidA + " " + oidB + " refs/heads/a\x00" + caps)[:30], nil, ErrUnreadable},
		{"no capabilities", body(oidA+" "+oidB+" refs/heads/a", "0000"), nil, ErrUnreadable},
		{"push options", body(oidA+" "+oidB+" refs/heads/a\x00report-status push-options", "0000"), nil, ErrRefused},
		{"unknown capability", body(oidA+" "+oidB+" refs/heads/a\x00report-status frobnicate", "0000"), nil, ErrRefused},
		{"unknown object format", body(oidA+" "+oidB+" refs/heads/a\x00object-format=md5", "0000"), nil, ErrRefused},
		{"signed push", body("push-cert\x00report-status", "certificate version 0.1\n", "0000"), nil, ErrRefused},
		{"uppercase hex", body(strings.ToUpper(oidA)+" "+oidB+" refs/heads/a\x00"+caps, "0000"), nil, ErrUnreadable},
		{"both zero", body(zero+" "+zero+" refs/heads/a\x00"+caps, "0000"), nil, ErrUnreadable},
		{"HEAD", body(oidA+" "+oidB+" HEAD\x00"+caps, "0000"), nil, ErrUnreadable},
		{"bad ref", body(oidA+" "+oidB+" refs/heads/a..b\x00"+caps, "0000"), nil, ErrUnreadable},
		{"ref with space", body(oidA+" "+oidB+" refs/heads/a b\x00"+caps, "0000"), nil, ErrUnreadable},
		{"second caps", body(oidA+" "+oidB+" refs/heads/a\x00"+caps, oidA+" "+oidB+" refs/heads/b\x00push-options", "0000"), nil, ErrUnreadable},
		{"delim", body(oidA+" "+oidB+" refs/heads/a\x00"+caps) + "0001" + "0000", nil, ErrUnreadable},
		{"empty pkt", body(oidA+" "+oidB+" refs/heads/a\x00"+caps) + "0004" + "0000", nil, ErrUnreadable},
		{"bad length", "zzzz", nil, ErrUnreadable},
		{"too long pkt", "fff1" + strings.Repeat("x", 0xfff1), nil, ErrUnreadable},
		{"too many", body(append([]string{oidA + " " + oidB + " refs/heads/a\x00" + caps}, append(repeat(oidA+" "+oidB+" refs/heads/b", MaxCommands), "0000")...)...), nil, ErrRefused},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, raw, err := Read(strings.NewReader(c.body))
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err %v, want %v", err, c.err)
				}
				if len(req.Commands) != 0 {
					t.Errorf("a refused request holds commands %v", req.Commands)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(req.Commands) != fmt.Sprint(c.want) {
				t.Errorf("commands %v, want %v", req.Commands, c.want)
			}
			if !strings.HasPrefix(c.body, string(raw)) || !bytes.HasSuffix(raw, []byte("0000")) {
				t.Errorf("read %q: want the body up to its first flush", raw)
			}
			if rest := c.body[len(raw):]; strings.Contains(c.body, "PACK") && rest != "PACK..." {
				t.Errorf("left %q unread, want the pack", rest)
			}
		})
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestReadBounded(t *testing.T) {
	// Endless shallow lines: Read stops at its bound, not at the end.
	line := pktS("shallow " + oidA)
	r := &endless{s: line}
	_, raw, err := Read(r)
	if !errors.Is(err, ErrUnreadable) {
		t.Fatalf("err %v", err)
	}
	if len(raw) > MaxSectionBytes {
		t.Errorf("read %d bytes, more than %d", len(raw), MaxSectionBytes)
	}
}

type endless struct {
	s string
	i int
}

func (e *endless) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		p[n] = e.s[e.i%len(e.s)]
		e.i++
		n++
	}
	return n, nil
}

func TestKind(t *testing.T) {
	for _, c := range []struct {
		c    Command
		want Kind
	}{{Command{zero, oidA, "r"}, Create}, {Command{oidA, zero, "r"}, Delete}, {Command{oidA, oidB, "r"}, Update}} {
		if got := c.c.Kind(); got != c.want {
			t.Errorf("%v: %s, want %s", c.c, got, c.want)
		}
	}
}
