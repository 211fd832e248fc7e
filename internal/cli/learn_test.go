package cli

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
)

// TestLearnAndPropose drives learn start, a recorded workload, propose,
// propose --json, propose --apply and learn stop against a real API.
func TestLearnAndPropose(t *testing.T) {
	run, eng := controlRig(t)
	if _, err := eng.Add("listed.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := run("net", "propose", "dev"); err != nil || !strings.Contains(stderr, "the learning record of dev is empty") {
		t.Errorf("propose of an empty record: %v %q", err, stderr)
	}
	if _, _, err := run("net", "learn", "stop", "dev"); err == nil || !strings.Contains(err.Error(), "is not learning") {
		t.Errorf("stop while active = %v, want an error saying it is not learning", err)
	}
	if _, stderr, err := run("net", "learn", "start", "dev"); err != nil || eng.Mode() != policy.Learn || !strings.Contains(stderr, "abox net propose dev") {
		t.Fatalf("learn start: %v (mode %s) %q", err, eng.Mode(), stderr)
	}
	obs := func(host, method, path string) {
		eng.Observe(policy.Observation{Kind: "inner", Host: host, Port: 443, Method: method, Path: path, Status: 200, Allowed: true})
	}
	obs("code.example.com", "GET", "/acme/app/info/refs")
	obs("code.example.com", "POST", "/acme/app/git-upload-pack")
	obs("listed.example.com", "PUT", "/anything")
	obs("api.example.org", "GET", "/v1/a")
	obs("api.example.org", "GET", "/v1/b")
	obs("api.example.org", "GET", "/v1/c")
	eng.Observe(policy.Observation{Kind: "http", Host: "10.0.0.5", Port: 80, Method: "GET", Path: "/", Status: 403, Reason: allowlist.ReasonNotAllowlisted})

	out, _, err := run("net", "learn", "show", "dev")
	if err != nil || !strings.Contains(out, "code.example.com") || !strings.Contains(out, "/acme/app/git-upload-pack") {
		t.Errorf("learn show = %q, %v", out, err)
	}
	out, stderr, err := run("net", "propose", "dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"--- " + eng.Path() + "\n+++ " + eng.Path() + " (proposed)\n@@ ",
		"+api.example.org GET /v1/*\n",
		"+code.example.com GET /acme/app/info/refs\n",
		"+# review: POST can carry data out: the guest sent POST /acme/app/git-upload-pack\n+code.example.com POST /acme/app/git-upload-pack\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("propose lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "listed.example.com") {
		t.Errorf("propose added a line for a host the list allows already:\n%s", out)
	}
	if !strings.Contains(stderr, "note: learn mode refused") || !strings.Contains(stderr, "--apply") {
		t.Errorf("propose's stderr = %q, want the refusal note and how to apply", stderr)
	}
	before, _ := os.ReadFile(eng.Path())
	if strings.Contains(string(before), "code.example.com") {
		t.Fatalf("propose without --apply changed the file:\n%s", before)
	}

	out, _, err = run("net", "propose", "dev", "--json")
	var res proposeResult
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || len(res.Lines) != 3 || res.Applied || res.Record.Hosts != 3 {
		t.Fatalf("propose --json = %v %+v\n%s", err, res, out)
	}

	if _, stderr, err := run("net", "propose", "dev", "--apply"); err != nil || !strings.Contains(stderr, "applied 3 lines") || !strings.Contains(stderr, "still learning") {
		t.Fatalf("propose --apply: %v %q", err, stderr)
	}
	data, _ := os.ReadFile(eng.Path())
	if !strings.Contains(string(data), "# review: POST can carry data out") || !strings.Contains(string(data), "\ncode.example.com POST /acme/app/git-upload-pack\n") || !strings.Contains(string(data), "# proposed by abox net propose") {
		t.Errorf("applied file:\n%s", data)
	}
	if _, stderr, err := run("net", "learn", "stop", "dev"); err != nil || eng.Mode() != policy.Active {
		t.Fatalf("learn stop: %v (mode %s) %q", err, eng.Mode(), stderr)
	}
	// In force: the recorded requests are allowed, a new write is not.
	d := eng.Decide("code.example.com")
	set := eng.List().Rules(d.Rule)
	if dec, _ := set.Check("POST", "/acme/app/git-upload-pack", ""); d.Verdict != allowlist.Allow || !dec.Allowed {
		t.Errorf("the recorded POST after apply: %+v %+v", d, dec)
	}
	if dec, _ := set.Check("POST", "/acme/app/git-receive-pack", ""); dec.Allowed || dec.Reason != "path_not_allowed" {
		t.Errorf("a new POST after apply: %+v, want path_not_allowed", dec)
	}
	if dec, _ := set.Check("DELETE", "/acme/app", ""); dec.Allowed || dec.Reason != "method_not_allowed" {
		t.Errorf("a new DELETE after apply: %+v, want method_not_allowed", dec)
	}
	// Nothing more to propose now.
	if out, stderr, err := run("net", "propose", "dev"); err != nil || out != "" || !strings.Contains(stderr, "allows everything recorded") {
		t.Errorf("propose after apply = %q %q %v", out, stderr, err)
	}
	if _, _, err := run("net", "learn", "clear", "dev"); err != nil || len(eng.Learned().Hosts) != 0 {
		t.Errorf("learn clear: %v, %d hosts left", err, len(eng.Learned().Hosts))
	}
	if _, _, err := run("net", "learn", "dev"); err == nil || !strings.Contains(err.Error(), "abox net learn start dev") {
		t.Errorf("learn with a name and no verb = %v, want the verb to use", err)
	}
	if _, _, err := run("net", "learn", "start", "dev", "extra"); err == nil || !strings.Contains(err.Error(), "takes an instance NAME") {
		t.Errorf("learn start with two arguments = %v", err)
	}
}

// TestProposeApplyRefusesProjectInstances: an instance made by abox up
// gets its allowlist from abox.yaml, so --apply points there instead.
func TestProposeApplyRefusesProjectInstances(t *testing.T) {
	run, eng := controlRig(t)
	eng.SetMode(policy.Learn)
	eng.Observe(policy.Observation{Kind: "inner", Host: "a.example.com", Port: 443, Method: "GET", Path: "/x", Status: 200, Allowed: true})
	dir := filepath.Dir(eng.Path())
	if err := os.WriteFile(filepath.Join(dir, "project.json"), []byte(`{"file":"/src/app/abox.yaml"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(eng.Path())
	out, _, err := run("net", "propose", "dev", "-w")
	var he *hintError
	if err == nil || !strings.Contains(err.Error(), "made by abox up from /src/app/abox.yaml") || !errors.As(err, &he) || !strings.Contains(he.hint, "abox trust") {
		t.Fatalf("propose -w on a project instance = %v", err)
	}
	if !strings.Contains(out, "+a.example.com GET /x") {
		t.Errorf("the refused apply did not show the lines to copy:\n%s", out)
	}
	if after, _ := os.ReadFile(eng.Path()); string(after) != string(before) {
		t.Errorf("the allowlist changed:\n%s", after)
	}
}
