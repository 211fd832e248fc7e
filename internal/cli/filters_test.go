package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/policy"
)

type statComp struct{ name string }

func (c statComp) Name() string { return c.name }
func (c statComp) Stats() any   { return map[string]int{"queries": 3, "blocked": 1} }

// controlRig runs a real local API for instance "dev" under a temporary
// data root, as the daemon would, and returns a way to run CLI commands.
func controlRig(t *testing.T) (run func(args ...string) (string, string, error), eng *policy.Engine) {
	t.Helper()
	root, err := os.MkdirTemp("", "abxcli") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	l := paths.Layout{Root: root}
	os.MkdirAll(l.InstanceDir("dev"), 0o755)
	eng, err = policy.New(policy.Config{AllowlistPath: l.Allowlist("dev")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := api.Listen(l.APISocket("dev"))
	if err != nil {
		t.Fatal(err)
	}
	ring := logring.New(10)
	fmt.Fprintln(ring, `{"msg":"dns","name":"blocked.example","verdict":"block","reason":"not_allowlisted"}`)
	srv := &api.Server{Instance: "dev", Policy: eng, Components: []api.Component{statComp{"dns"}, statComp{"http"}},
		Logs: map[string]*logring.Ring{"dns": ring}, Metrics: rigMetrics().Handler()}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	run = func(args ...string) (string, string, error) { return runCLIIn(l, "", args...) }
	return run, eng
}

func TestAllowlistCommands(t *testing.T) {
	run, eng := controlRig(t)
	if _, stderr, err := run("allowlist", "add", "dev", "Example.com", "*.example.org"); err != nil || !strings.Contains(stderr, "added example.com") {
		t.Fatalf("add: %v %q", err, stderr)
	}
	if d := eng.Decide("a.example.org"); d.Verdict != "allow" {
		t.Errorf("add did not reach the filters: %+v", d)
	}
	out, _, err := run("allowlist", "list", "dev")
	if err != nil || out != "example.com\n*.example.org\n" {
		t.Errorf("list = %q, %v", out, err)
	}
	if _, _, err := run("allowlist", "add", "dev", "*.co.uk"); err == nil || !strings.Contains(err.Error(), "public suffix") {
		t.Errorf("add of a public-suffix wildcard = %v", err)
	}
	if _, _, err := run("allowlist", "remove", "dev", "nothere.example"); err == nil || !strings.Contains(err.Error(), "not listed") {
		t.Errorf("remove of a missing entry = %v", err)
	}
	if _, _, err := run("allowlist", "remove", "dev", "example.com"); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(eng.Path())
	if strings.Contains(string(data), "\nexample.com\n") {
		t.Errorf("removed entry still in the file:\n%s", data)
	}
	os.WriteFile(eng.Path(), []byte("ok.example.com\n*\n"), 0o644)
	if _, _, err := run("allowlist", "reload", "dev"); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("reload of a bad file = %v, want file:line", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	os.WriteFile(bad, []byte("fine.example.com\nhttp://x.example.com\n"), 0o644)
	if _, _, err := run("allowlist", "check", bad); err == nil || !strings.Contains(err.Error(), bad+":2:") {
		t.Errorf("check = %v", err)
	}
}

func TestModeAndProfileCommands(t *testing.T) {
	run, eng := controlRig(t)
	if out, _, err := run("net", "filter", "dev"); err != nil || strings.TrimSpace(out) != "active" {
		t.Errorf("net filter = %q, %v", out, err)
	}
	if _, _, err := run("net", "filter", "dev", "passive"); err != nil || eng.Mode() != policy.Passive {
		t.Fatalf("set passive: %v (mode %s)", err, eng.Mode())
	}
	if _, _, err := run("net", "filter", "dev", "open"); err == nil {
		t.Error("an unknown mode was accepted")
	}
	eng.Decide("seen.example.net")
	eng.Decide("healthcheck.abox.local")
	out, _, err := run("net", "profile", "export", "dev")
	if err != nil || !strings.Contains(out, "\nseen.example.net\n") || strings.Contains(out, "healthcheck") {
		t.Errorf("export = %q, %v", out, err)
	}
	file := filepath.Join(t.TempDir(), "profile.txt")
	if _, _, err := run("net", "profile", "export", "dev", "-o", file); err != nil {
		t.Fatal(err)
	}
	// The export is itself a valid allowlist.
	if _, _, err := run("allowlist", "check", file); err != nil {
		t.Errorf("exported profile is not a valid allowlist: %v", err)
	}
	out, _, err = run("net", "profile", "show", "dev", "--json")
	var p policy.ProfileSnapshot
	if err != nil || json.Unmarshal([]byte(out), &p) != nil || len(p.Entries) != 1 {
		t.Errorf("show --json = %q, %v", out, err)
	}
	if _, _, err := run("net", "profile", "clear", "dev"); err != nil || len(eng.Profile().Entries) != 0 {
		t.Errorf("clear: %v, %d left", err, len(eng.Profile().Entries))
	}
}

func TestStatusAndLogsCommands(t *testing.T) {
	run, _ := controlRig(t)
	out, _, err := run("dns", "status", "dev")
	if err != nil || !strings.Contains(out, "mode:") || !strings.Contains(out, "queries:") {
		t.Errorf("dns status = %q, %v", out, err)
	}
	out, _, err = run("http", "status", "dev", "--json")
	var m map[string]any
	if err != nil || json.Unmarshal([]byte(out), &m) != nil || m["http"] == nil || m["mode"] != "active" {
		t.Errorf("http status --json = %q, %v", out, err)
	}
	out, _, err = run("dns", "logs", "dev", "-n", "5")
	if err != nil || !strings.Contains(out, `"reason":"not_allowlisted"`) {
		t.Errorf("dns logs = %q, %v", out, err)
	}
	if _, _, err := run("dns", "status", "ghost"); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("status of an instance without filters = %v", err)
	}
	if _, _, err := run("dns", "status", "1bad"); err == nil {
		t.Error("an invalid instance name was accepted")
	}
}

func TestAllowlistEdit(t *testing.T) {
	run, eng := controlRig(t)
	dir := t.TempDir()
	editor := func(content string) {
		script := filepath.Join(dir, "ed.sh")
		os.WriteFile(script, []byte("#!/bin/sh\nprintf '"+content+"' > \"$1\"\n"), 0o755)
		t.Setenv("VISUAL", "")
		t.Setenv("EDITOR", script)
	}
	editor(`edited.example.com\n`)
	if _, stderr, err := run("allowlist", "edit", "dev"); err != nil || !strings.Contains(stderr, "applied") {
		t.Fatalf("edit: %v %q", err, stderr)
	}
	if eng.Decide("edited.example.com").Verdict != "allow" {
		t.Error("the edit did not reach the filters")
	}
	// An invalid edit is refused (no answer on stdin means "do not retry")
	// and the file and the filters keep the previous list.
	before, _ := os.ReadFile(eng.Path())
	editor(`other.example.com\n*\n`)
	if _, stderr, err := run("allowlist", "edit", "dev"); err == nil || !strings.Contains(stderr, ":2:") {
		t.Fatalf("invalid edit: %v %q", err, stderr)
	}
	after, _ := os.ReadFile(eng.Path())
	if string(after) != string(before) || eng.Decide("other.example.com").Verdict != "block" {
		t.Errorf("an invalid edit changed the allowlist:\n%s", after)
	}
}
