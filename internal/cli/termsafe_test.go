package cli

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/abox-dev/abox/internal/termtext"
)

// TestLogsAndJSONCannotDriveTheTerminal: decision-log lines carry what the
// guest asked for (a URL path may hold any UTF-8, the 8-bit CSI U+009B and
// bidirectional overrides included), and --json output carries guest text
// too; neither may reach the terminal as controls, and both stay JSON.
func TestLogsAndJSONCannotDriveTheTerminal(t *testing.T) {
	line := json.RawMessage(`{"host":"origin.test","path":"/` + "\u009b" + `2J` + "\u202e" + `txt.exe` + "\x7f" + `"}`)
	var out bytes.Buffer
	printLines(&out, []json.RawMessage{line})
	if err := termtext.Check(string(bytes.TrimSuffix(out.Bytes(), []byte("\n")))); err != nil {
		t.Errorf("logs print %q: %v", out.String(), err)
	}
	var v map[string]string
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["path"] != "/\u009b2J\u202etxt.exe\x7f" {
		t.Errorf("logs line no longer means the same: %v %q", err, v["path"])
	}
	out.Reset()
	if err := writeJSON(&out, map[string]string{"error": "cloud-init: \u009b2J\u2066"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range out.String() {
		if termtext.Unsafe(r) && r != '\n' {
			t.Errorf("--json prints %U: %q", r, out.String())
		}
	}
}
