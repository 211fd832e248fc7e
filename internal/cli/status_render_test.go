package cli

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/paths"
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

type troubledComp struct{ name string }

func (c troubledComp) Name() string { return c.name }
func (c troubledComp) Stats() any {
	if c.name == "dns" {
		return map[string]any{"queries": 1, "log_error": "write dns.log: no space left on device", "panics": 2}
	}
	return map[string]any{"requests": 1, "log": map[string]any{"last_error": "write http.log: no space left on device"}}
}

// TestInstanceStatusWarnsOfLogTrouble: abox status NAME asks the running
// filters and warns when a decision log cannot be written.
func TestInstanceStatusWarnsOfLogTrouble(t *testing.T) {
	root, err := os.MkdirTemp("", "abxst") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	l := paths.Layout{Root: root}
	os.MkdirAll(l.InstanceDir("dev"), 0o755)
	eng, err := policy.New(policy.Config{AllowlistPath: l.Allowlist("dev")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(l.APISocket("dev"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &api.Server{Instance: "dev", Policy: eng, Components: []api.Component{troubledComp{"dns"}, troubledComp{"http"}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	e := &env{layout: func() (paths.Layout, error) { return l, nil }}
	got := strings.Join(e.filterTrouble(context.Background(), "dev"), "\n")
	for _, want := range []string{"dns decision log cannot be written: write dns.log: no space", "http decision log cannot be written: write http.log: no space", "dns filter contained 2 panics"} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "http filter contained") {
		t.Errorf("warnings %q name panics of a filter that had none", got)
	}
	if w := e.filterTrouble(context.Background(), "absent"); len(w) != 0 {
		t.Errorf("warnings for an instance whose filters do not answer: %v", w)
	}
}
