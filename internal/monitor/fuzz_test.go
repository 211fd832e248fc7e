package monitor

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/abox-dev/abox/internal/termtext"
)

// FuzzParse: every line of the monitor channel is the guest's. Whatever
// its bytes, Parse gives an error, a heartbeat or an event whose every
// string is printable text (termtext's rule, the one the rest of abox
// applies to the operator's terminal) within its bound, of a known type;
// the stored JSON line is one line, and the rendered line is printable.
func FuzzParse(f *testing.F) {
	for _, r := range []string{
		string(export(f, execEvent("/usr/bin/curl", "-s https://example.com", 1000))),
		string(export(f, execEvent("/bin/x\u2028y", "a\x1b[2Jb\u202ec\u2029d\u0085e", 0))),
		string(export(f, fileEvent("/etc/shadow\u2028", 4))),
		string(export(f, netEvent("93.184.216.34", 443))),
		`{"abox_heartbeat":{"seq":3,"agent":"tet\u2028ragon\u001b]0;x\u0007","agent_up":true}}`,
		`{"process_exit":{"process":{"binary":"/bin/sh"},"signal":"SIG\u2029KILL","status":9}}`,
		`{"process_tracepoint":{"subsys":"raw\u2028","event":"sys_enter"}}`,
		`not json`, `{}`, `[1,2]`,
	} {
		f.Add([]byte(r))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, hb, err := Parse(line, time.Unix(0, 0))
		if err != nil {
			return
		}
		if hb != nil {
			checkField(t, line, "heartbeat agent", hb.Agent, 64)
			return
		}
		if !slices.Contains(Types, ev.Type) {
			t.Fatalf("%q: event of type %q", line, ev.Type)
		}
		for _, fl := range []struct {
			name, v string
			max     int
		}{
			{"node", ev.Node, maxField}, {"kind", ev.Kind, maxField}, {"function", ev.Function, 128}, {"policy", ev.Policy, 128},
			{"action", ev.Action, maxField}, {"path", ev.Path, maxField}, {"op", ev.Op, maxField}, {"proto", ev.Proto, maxField},
			{"src", ev.Src, maxField}, {"dst", ev.Dst, maxField}, {"signal", ev.Signal, 32},
		} {
			checkField(t, line, fl.name, fl.v, fl.max)
		}
		for _, p := range []*Proc{ev.Process, ev.Parent} {
			if p != nil {
				checkField(t, line, "binary", p.Binary, maxField)
				checkField(t, line, "args", p.Args, maxArgs)
				checkField(t, line, "cwd", p.Cwd, maxField)
			}
		}
		b, err := json.Marshal(ev)
		if err != nil || strings.ContainsAny(string(b), "\n\r") {
			t.Fatalf("%q: stored as %q, %v", line, b, err)
		}
		if err := termtext.Check(ev.Line()); err != nil {
			t.Fatalf("%q: rendered as %q: %v", line, ev.Line(), err)
		}
	})
}

func checkField(t *testing.T, line []byte, name, v string, max int) {
	t.Helper()
	if err := termtext.Check(v); err != nil {
		t.Fatalf("%q: the %s %q is not printable: %v", line, name, v, err)
	}
	if len(v) > max || !utf8.ValidString(v) {
		t.Fatalf("%q: the %s is %d bytes, over %d", line, name, len(v), max)
	}
}
