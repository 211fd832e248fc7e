package cli

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/api"
	"go.yaml.in/yaml/v3"
)

// TestAllowlistRuleCommands: rule lines reach the filters through add,
// whole or as separate words, are listed a line per rule, and are removed
// one by one; a name listed both ways is refused with the fix.
func TestAllowlistRuleCommands(t *testing.T) {
	run, eng := controlRig(t)
	if _, stderr, err := run("allowlist", "add", "dev", "api.github.com GET,HEAD /**", "api.github.com", "POST", "/repos/acme/app/pulls", "example.com"); err != nil ||
		!strings.Contains(stderr, "added api.github.com POST /repos/acme/app/pulls\n") {
		t.Fatalf("add: %v %q", err, stderr)
	}
	out, _, err := run("allowlist", "list", "dev")
	if want := "api.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls\nexample.com\n"; err != nil || out != want {
		t.Errorf("list = %q, %v; want %q", out, err, want)
	}
	_, _, err = run("allowlist", "add", "dev", "example.com", "GET", "/")
	var ae *api.Error
	if !errors.As(err, &ae) || !strings.Contains(err.Error(), "example.com is listed without rules") || !strings.Contains(ae.Hint, "abox allowlist remove dev example.com") {
		t.Errorf("a rule for a name without rules: %v", err)
	}
	if _, _, err := run("allowlist", "add", "dev", "uploads.example.com", "--rule", "PUT /incoming/*", "--rule", "GET /incoming/*"); err != nil || eng.List().Rules("uploads.example.com").String() != "PUT /incoming/*; GET /incoming/*" {
		t.Errorf("add --rule: %v, rules %q", err, eng.List().Rules("uploads.example.com").String())
	}
	if _, _, err := run("allowlist", "remove", "dev", "uploads.example.com", "--rule", "PUT /incoming/*"); err != nil || eng.List().Rules("uploads.example.com").String() != "GET /incoming/*" {
		t.Errorf("remove --rule: %v, rules %q", err, eng.List().Rules("uploads.example.com").String())
	}
	if _, stderr, err := run("allowlist", "remove", "dev", "api.github.com POST /repos/acme/app/pulls"); err != nil || strings.Contains(stderr, "no rules left") {
		t.Errorf("remove one rule: %v %q", err, stderr)
	}
	if got := eng.List().Rules("api.github.com").String(); got != "GET,HEAD /**" {
		t.Errorf("rules after remove = %q", got)
	}
	if _, stderr, err := run("allowlist", "remove", "dev", "api.github.com", "GET,HEAD", "/**"); err != nil || !strings.Contains(stderr, "api.github.com has no rules left and is no longer allowed") {
		t.Errorf("remove the last rule: %v %q", err, stderr)
	}
	// A name removes its rules, and says so.
	if _, _, err := run("allowlist", "add", "dev", "api.github.com", "--rule", "GET /a", "--rule", "GET /b"); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := run("allowlist", "remove", "dev", "api.github.com"); err != nil || stderr != "removed api.github.com GET /a\nremoved api.github.com GET /b\n" {
		t.Errorf("remove a name with rules: %v %q", err, stderr)
	}
}

func TestAllowlistLines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		rules []string
		want  []string
		err   string
	}{
		{"names", []string{"a.example.com", "*.example.org"}, nil, []string{"a.example.com", "*.example.org"}, ""},
		{"whole lines", []string{"a.example.com GET /x", "b.example.com"}, nil, []string{"a.example.com GET /x", "b.example.com"}, ""},
		{"words", []string{"a.example.com", "GET,HEAD", "/x.git", "audit", "b.example.com", "POST"}, nil, []string{"a.example.com GET,HEAD /x.git audit", "b.example.com POST"}, ""},
		{"a lower-case method joins to be refused by the rule", []string{"a.example.com", "get"}, nil, []string{"a.example.com get"}, ""},
		{"the first is a line", []string{"localhost"}, nil, []string{"localhost"}, ""},
		{"a glob the shell expanded", []string{"a.example.com", "GET", "/bin", "/boot"}, nil, nil, "two patterns in one line"},
		{"a glob after a whole line", []string{"a.example.com GET /bin", "/boot"}, nil, nil, "two patterns in one line"},
		{"--rule for each name", []string{"a.example.com", "b.example.com"}, []string{"GET /**", "POST /x"}, []string{"a.example.com GET /**", "a.example.com POST /x", "b.example.com GET /**", "b.example.com POST /x"}, ""},
		{"--rule with a line", []string{"a.example.com GET /"}, []string{"POST /x"}, nil, "with --rule, give names only"},
		{"--rule with a rule word", []string{"a.example.com", "GET"}, []string{"POST /x"}, nil, "with --rule, give names only"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := allowlistLines(tc.args, tc.rules)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestAllowlistPresetsCommand: the presets are listed, and each prints
// lines that are a valid allowlist and, with --yaml, valid abox.yaml items
// giving the same lines.
func TestAllowlistPresetsCommand(t *testing.T) {
	run, _ := controlRig(t)
	out, _, err := run("allowlist", "presets")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range allowlist.Presets() {
		if !strings.Contains(out, p.Name) {
			t.Errorf("list lacks %s:\n%s", p.Name, out)
		}
		text, _, err := run("allowlist", "presets", p.Name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := allowlist.Parse(strings.NewReader(text), p.Name)
		if err != nil || len(l.Lines()) != len(p.Lines) {
			t.Errorf("%s prints no valid allowlist: %v\n%s", p.Name, err, text)
		}
		y, _, err := run("allowlist", "presets", p.Name, "--yaml")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct{ Allowlist []string }
		if err := yaml.Unmarshal([]byte(y), &doc); err != nil || !reflect.DeepEqual(doc.Allowlist, p.Lines) {
			t.Errorf("%s --yaml = %q, %v\n%s", p.Name, doc.Allowlist, err, y)
		}
	}
	if _, _, err := run("allowlist", "presets", "github"); err == nil || !strings.Contains(err.Error(), "known: github-readonly") {
		t.Errorf("an unknown preset: %v", err)
	}
}
