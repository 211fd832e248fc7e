package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestAllowlistRulesBothForms: an allowlist item is a line or a host with
// its rules, and both give the same lines, in order.
func TestAllowlistRulesBothForms(t *testing.T) {
	src := `version: 1
name: dev
allowlist:
  - example.com
  - "github.com GET /*/*/info/refs?service=git-upload-pack"
  - host: API.GitHub.com
    rules:
      - GET,HEAD /**
      - POST /repos/acme/app/pulls
  - host: registry.example.org
    rules: ["GET /**"]
    audit: true
  - host: plain.example.net
  - example.com
`
	c, err := parse(t, src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ln := range c.Allowlist {
		got = append(got, ln.String())
	}
	want := []string{
		"example.com",
		"github.com GET /*/*/info/refs?service=git-upload-pack",
		"api.github.com GET,HEAD /**",
		"api.github.com POST /repos/acme/app/pulls",
		"registry.example.org GET /**",
		"registry.example.org audit",
		"plain.example.net",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("lines:\n got %q\nwant %q", got, want)
	}
	if c.Allowlist[2].Entry.Line != 6 {
		t.Errorf("api.github.com's line = %d, want 6 (its item's)", c.Allowlist[2].Entry.Line)
	}
}

// TestAllowlistRulesErrors: every bad item is an error at its file:line
// that says what to write instead.
func TestAllowlistRulesErrors(t *testing.T) {
	head := "version: 1\nname: dev\nallowlist:\n"
	for _, tc := range []struct{ name, src, want string }{
		{"unknown method", "  - host: a.example.com\n    rules: [\"FETCH /x\"]\n", `abox.yaml:5:13: allowlist[0].rules[0]: a.example.com: "FETCH" is not a method`},
		{"lower-case method", "  - \"a.example.com get /x\"\n", `abox.yaml:4:5: allowlist[0]: a.example.com: "get": methods are case-sensitive; write GET`},
		{"pattern not a path", "  - host: a.example.com\n    rules: [\"GET x/y\"]\n", `abox.yaml:5:13: allowlist[0].rules[0]: a.example.com: "x/y": a path pattern starts with /`},
		{"pattern not canonical", "  - host: a.example.com\n    rules:\n      - GET /a/../b\n", `abox.yaml:6:9: allowlist[0].rules[0]: a.example.com: "/a/../b" is not a canonical path`},
		{"partial wildcard", "  - \"a.example.com GET /*.git\"\n", "abox.yaml:4:5: allowlist[0]: a.example.com: \"/*.git\": * and ** stand for whole segments"},
		{"empty rules", "  - host: a.example.com\n    rules: []\n", "abox.yaml:5:12: allowlist[0].rules: no rules; leave rules out"},
		{"rules without a value", "  - host: a.example.com\n    rules:\n", "abox.yaml:5:11: allowlist[0].rules: no rules; leave rules out"},
		{"an empty mapping", "  - {}\n", "abox.yaml:4:5: allowlist[0]: no host"},
		{"empty rule", "  - host: a.example.com\n    rules: [\"\"]\n", "abox.yaml:5:13: allowlist[0].rules[0]: an empty rule"},
		{"no host", "  - rules: [\"GET /\"]\n", "abox.yaml:4:5: allowlist[0]: no host"},
		{"bad host", "  - host: \"*\"\n    rules: [\"GET /\"]\n", `abox.yaml:4:11: allowlist[0].host: "*" would allow everything`},
		{"unknown key", "  - host: a.example.com\n    rule: [\"GET /\"]\n", `abox.yaml:5:5: unknown key "allowlist[0].rule" (did you mean "rules"?)`},
		{"rules not a list", "  - host: a.example.com\n    rules: GET /\n", "abox.yaml:5:12: allowlist[0].rules: want a list"},
		{"audit not a bool", "  - host: a.example.com\n    audit: yes\n", "allowlist[0].audit: want true or false"},
		{"an unquoted wildcard", "  - *.example.com\n", `abox.yaml: line 4: did not find expected alphabetic or numeric character (a value that starts with * is an alias to YAML: quote it, as in - "*.example.com")`},
		{"a list item", "  - [a.example.com]\n", "abox.yaml:4:5: allowlist[0]: want an allowlist line"},
		{"two names", "  - \"a.example.com b.example.com\"\n", "one name per line"},
		{"with and without rules", "  - a.example.com\n  - host: a.example.com\n    rules: [\"GET /\"]\n",
			"abox.yaml:5:5: allowlist[1]: a.example.com is listed with rules at allowlist[1] (line 5) and without rules at allowlist[0] (line 4); without rules it allows everything on the host, so the rules would not count: drop the rules or the item without them"},
		{"without after with", "  - \"a.example.com GET /\"\n  - A.example.com\n", "allowlist[1]: a.example.com is listed with rules at allowlist[0] (line 4) and without rules at allowlist[1] (line 5)"},
		{"rules on an exception", "  - \"a.example.com GET /\"\nmitm: {exceptions: [a.example.com]}\n", "allowlist: a.example.com has rules, but a.example.com is in mitm.exceptions"},
		{"rules under a wildcard exception", "  - \"*.example.com GET /\"\nmitm: {exceptions: [a.example.com]}\n", "allowlist: *.example.com has rules, but a.example.com is in mitm.exceptions"},
		{"rules without interception", "  - \"a.example.com GET /\"\nmitm: {enabled: false}\n", "allowlist: a.example.com has rules, but mitm.enabled is false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, head+tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v\nwant %q", err, tc.want)
			}
		})
	}
	// The same names without rules are fine beside an exception.
	if _, err := parse(t, head+"  - a.example.com\nmitm: {exceptions: [a.example.com]}\n"); err != nil {
		t.Errorf("an exception for a name without rules: %v", err)
	}
}

// TestMergedAllowlistCarriesRules: the allowlist file's rule lines reach
// the merged list, and a name with rules in one and without in the other
// is refused.
func TestMergedAllowlistCarriesRules(t *testing.T) {
	path := project(t, map[string]string{
		FileName:    "version: 1\nname: dev\nallowlist:\n  - host: api.github.com\n    rules: [\"GET,HEAD /**\"]\nallowlist_file: allow.txt\n",
		"allow.txt": "# file\napi.github.com POST /repos/acme/app/pulls\napi.github.com GET,HEAD /**\nexample.com\n",
	})
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := []string{"api.github.com GET,HEAD /**", "api.github.com POST /repos/acme/app/pulls", "example.com"}
	if got := p.MergedAllowlist(); !reflect.DeepEqual(got, want) {
		t.Errorf("merged:\n got %q\nwant %q", got, want)
	}

	path = project(t, map[string]string{
		FileName:    "version: 1\nname: dev\nallowlist: [api.github.com]\nallowlist_file: allow.txt\n",
		"allow.txt": "api.github.com GET /**\n",
	})
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "allowlist_file: allow.txt and allowlist together: api.github.com is listed without rules") {
		t.Errorf("a name with rules in the file and without inline: %v", err)
	}
	path = project(t, map[string]string{
		FileName:    "version: 1\nname: dev\nallowlist_file: allow.txt\nmitm: {enabled: false}\n",
		"allow.txt": "api.github.com GET /**\n",
	})
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "mitm.enabled is false") {
		t.Errorf("file rules without interception: %v", err)
	}
}

// TestTrustByRule: a content that adds or widens a rule, or drops all of a
// name's rules, needs trust again; one that only narrows what was trusted
// does not, and neither does going back to what was trusted.
func TestTrustByRule(t *testing.T) {
	const trusted = "version: 1\nname: dev\ncpus: 4\nallowlist:\n  - example.com\n  - host: api.github.com\n    rules: [\"GET,HEAD /repos/**\", \"POST /repos/acme/app/pulls\"]\n"
	dir := filepath.Dir(project(t, map[string]string{FileName: trusted, "allow.txt": "", "t.xml": "<domain/>"}))
	store := TrustStore{Dir: filepath.Join(t.TempDir(), "trust")}
	load := func(t *testing.T, src string) *Project {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := Load(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	if err := store.Check(load(t, trusted)); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("untrusted content passes: %v", err)
	}
	if err := store.Trust(load(t, trusted)); err != nil {
		t.Fatal(err)
	}
	replace := func(old, new string) string {
		if !strings.Contains(trusted, old) {
			t.Fatalf("%q not in the trusted file", old)
		}
		return strings.Replace(trusted, old, new, 1)
	}
	for _, tc := range []struct {
		name, src string
		// since is a part of what the error says widened; "" means the
		// content passes without trust.
		since string
	}{
		{"the same content", trusted, ""},
		{"a comment added", trusted + "# reviewed\n", ""},
		{"a rule narrowed", replace("/repos/**", "/repos/acme/**"), ""},
		{"a method dropped", replace("GET,HEAD /repos/**", "GET /repos/**"), ""},
		{"a rule dropped", replace(`, "POST /repos/acme/app/pulls"`, ""), ""},
		{"a name dropped", replace("  - example.com\n", ""), ""},
		{"fewer CPUs is another setting", replace("cpus: 4", "cpus: 3"), "cpus: gives the guest 3 virtual CPUs"},
		{"a rule widened", replace("/repos/**", "/**"), "allowlist: api.github.com: allows more on api.github.com"},
		{"a method added", replace("GET,HEAD /repos/**", "GET,HEAD,POST /repos/**"), "allows more on api.github.com"},
		{"a rule added", replace(`"POST /repos/acme/app/pulls"`, `"POST /repos/acme/app/pulls", "DELETE /repos/**"`), "allows more on api.github.com"},
		{"all rules dropped", replace("    rules: [\"GET,HEAD /repos/**\", \"POST /repos/acme/app/pulls\"]\n", ""), "allows more on api.github.com: everything"},
		{"the entry put on trial", replace("]\n", "]\n    audit: true\n"), "allows more on api.github.com"},
		{"a name added", trusted + "  - exfil.example.net\n", "allowlist: exfil.example.net: lets the guest reach exfil.example.net"},
		{"a rule added through a file", trusted + "allowlist_file: allow2.txt\n", "allowlist: api.github.com: allows more"},
		{"a template added", trusted + "overrides: {libvirt: {template: t.xml}}\n", "overrides.libvirt.template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			os.WriteFile(filepath.Join(dir, "allow2.txt"), []byte("api.github.com PUT /**\n"), 0o644)
			err := store.Check(load(t, tc.src))
			if tc.since == "" {
				if err != nil {
					t.Errorf("a content that only narrows needs trust: %v", err)
				}
				return
			}
			var ue *UntrustedError
			if !errors.As(err, &ue) {
				t.Fatalf("a widening passes: %v", err)
			}
			if !strings.Contains(err.Error(), "beyond the content trusted at") || !strings.Contains(err.Error(), tc.since) {
				t.Errorf("error:\n%v\nwant it to name %q", err, tc.since)
			}
		})
	}
}

// TestTrustBaselineIsPerFile: what was trusted for one file is no baseline
// for another (the same bytes in another directory ask again).
func TestTrustBaselineIsPerFile(t *testing.T) {
	src := "version: 1\nname: dev\nallowlist: [\"api.github.com GET /**\"]\n"
	store := TrustStore{Dir: filepath.Join(t.TempDir(), "trust")}
	a, err := Load(project(t, map[string]string{FileName: src}))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := store.Trust(a); err != nil {
		t.Fatal(err)
	}
	b, err := Load(project(t, map[string]string{FileName: strings.Replace(src, "/**", "/repos/**", 1)}))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := store.Check(b); !errors.Is(err, ErrUntrusted) {
		t.Errorf("another file narrowing a trusted one passes: %v", err)
	}
}
