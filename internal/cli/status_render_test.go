package cli

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
)

// TestStatusShowsTrouble: status names an allowlist change that is in force
// but unsaved, and a decision log that cannot be written, for both filters'
// shapes of counters.
func TestStatusShowsTrouble(t *testing.T) {
	st := api.Status{Instance: "dev", Mode: "active", Allowlist: policy.ReloadStatus{Path: "/x/allowlist.txt", Unsaved: "write /x/allowlist.txt: no space left on device", UnsavedAt: time.Unix(1, 0)}}
	for component, stats := range map[string]any{
		"dns":  map[string]any{"queries": 3, "log_error": "write dns.log: no space left on device"},
		"http": map[string]any{"requests": 3, "log": map[string]any{"last_error": "write http.log: no space left on device"}},
	} {
		var b bytes.Buffer
		renderStatus(&b, st, component, stats)
		out := b.String()
		if !strings.Contains(out, "unsaved allowlist change:") || !strings.Contains(out, "decision log error:") || !strings.Contains(out, component+".log: no space") {
			t.Errorf("%s status:\n%s\nwant the unsaved change and the log error", component, out)
		}
	}
}
