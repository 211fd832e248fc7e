package allowlist

import (
	"errors"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/reqrules"
)

// The example file.
const ruledList = `
api.github.com GET,HEAD /**
api.github.com POST /repos/acme/app/pulls   # one write
registry.example.org GET /**
uploads.example.com PUT /incoming/*
example.com
*.cdn.example.net GET /** audit
`

func TestParseRules(t *testing.T) {
	l := mustParse(t, ruledList)
	if l.Len() != 5 {
		t.Fatalf("Len = %d, want 5 entries", l.Len())
	}
	tests := []struct {
		name, method, path string
		allowed            bool
		reason, wouldDeny  string
	}{
		{"api.github.com", "GET", "/repos/other/x", true, "", ""},
		{"api.github.com", "POST", "/repos/acme/app/pulls", true, "", ""},
		{"api.github.com", "POST", "/repos/acme/app/issues", false, reqrules.ReasonPathNotAllowed, ""},
		{"api.github.com", "DELETE", "/repos/acme/app", false, reqrules.ReasonMethodNotAllowed, ""},
		{"registry.example.org", "PUT", "/x", false, reqrules.ReasonMethodNotAllowed, ""},
		{"uploads.example.com", "PUT", "/incoming/a.tar", true, "", ""},
		{"uploads.example.com", "PUT", "/incoming/a/b", false, reqrules.ReasonPathNotAllowed, ""},
		{"example.com", "DELETE", "/a/..;/b", true, "", ""}, // no rules: everything
		// An audit rule alone: what it allows, nothing else would.
		{"a.cdn.example.net", "GET", "/x", true, "", reqrules.ReasonMethodNotAllowed},
		{"a.cdn.example.net", "POST", "/x", false, reqrules.ReasonMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name+" "+tt.method+" "+tt.path, func(t *testing.T) {
			d := l.Match(tt.name)
			if d.Verdict != Allow {
				t.Fatalf("Match(%q) = %+v", tt.name, d)
			}
			set := l.Rules(d.Rule)
			rd, _ := set.Check(tt.method, tt.path, "")
			if rd.Allowed != tt.allowed || rd.Reason != tt.reason || rd.WouldDeny != tt.wouldDeny {
				t.Errorf("rules %q: %+v, want allowed %v reason %q would_deny %q", set, rd, tt.allowed, tt.reason, tt.wouldDeny)
			}
			if set != nil && rd.Set != d.Rule {
				t.Errorf("the rule set is named %q, want the entry %q", rd.Set, d.Rule)
			}
		})
	}
	if got := l.Rules("api.github.com").String(); got != "GET,HEAD /**; POST /repos/acme/app/pulls" {
		t.Errorf("api.github.com's rules = %q: the lines of one name add up", got)
	}
	var names []string
	for _, e := range l.Restricted() {
		names = append(names, e.String())
	}
	if got := strings.Join(names, " "); got != "api.github.com registry.example.org uploads.example.com *.cdn.example.net" {
		t.Errorf("Restricted = %q", got)
	}
	if l.Rules("nowhere.example") != nil || (*List)(nil).Rules("x") != nil {
		t.Error("a name without an entry has rules")
	}
}

func TestTextRoundTrip(t *testing.T) {
	l := mustParse(t, ruledList)
	want := "api.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls\nregistry.example.org GET /**\n" +
		"uploads.example.com PUT /incoming/*\nexample.com\n*.cdn.example.net GET /** audit\n"
	if got := l.Text(); got != want {
		t.Fatalf("Text =\n%s\nwant\n%s", got, want)
	}
	again := mustParse(t, l.Text())
	if again.Text() != want {
		t.Errorf("Text does not parse back to itself")
	}
	nl, err := NewLines(l.Lines())
	if err != nil || nl.Text() != want {
		t.Errorf("NewLines(Lines()) = %q, %v", nl.Text(), err)
	}
}

func TestParseRuleLinesRejects(t *testing.T) {
	tests := []struct{ text, why string }{
		{"api.github.com GETS /x", `"GETS" is not a method`},
		{"api.github.com get /x", "write GET"},
		{"api.github.com GET repos", "starts with /"},
		{"api.github.com GET /a/../b", "not a canonical path"},
		{"api.github.com GET /a%2Fb", "encoded slash"},
		{"api.github.com GET /x audit more", "last word"},
		{"exa mple.com", "one name per line"},
		{"a.example.com b.example.com", "one name per line"},
		{"*.com GET /", "top-level"},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			_, err := Parse(strings.NewReader("ok.example.com\n"+tt.text+"\n"), "/p/allow.txt")
			var pe *ParseError
			if !errors.As(err, &pe) || len(pe.Lines) != 1 {
				t.Fatalf("Parse error = %v, want one line error", err)
			}
			if !strings.HasPrefix(err.Error(), "/p/allow.txt:2: ") || !strings.Contains(err.Error(), tt.why) {
				t.Errorf("error = %q, want /p/allow.txt:2: and %q", err, tt.why)
			}
		})
	}
}

func TestNameWithAndWithoutRules(t *testing.T) {
	for _, tt := range []struct{ text, at string }{
		{"api.github.com\nx.example.com\napi.github.com GET /**\n", "f:3:"},
		{"api.github.com GET /**\nx.example.com\nAPI.github.com.\n", "f:3:"},
		{"api.github.com\napi.github.com audit\n", "f:2:"},
	} {
		_, err := Parse(strings.NewReader(tt.text), "f")
		if err == nil || !strings.Contains(err.Error(), tt.at) || !strings.Contains(err.Error(), "line 1") || !strings.Contains(err.Error(), "allows everything") {
			t.Errorf("Parse(%q) = %v, want %s naming line 1", tt.text, err, tt.at)
		}
	}
	if _, err := NewLines([]Line{{Entry: Entry{Name: "a.example.com"}}, mustLine(t, "a.example.com GET /")}); err == nil {
		t.Error("NewLines took a name with and without rules")
	}
	// A duplicate line, with or without rules, is no conflict.
	l := mustParse(t, "a.example.com\na.example.com\nb.example.com GET /x\nb.example.com GET /x\n")
	if l.Len() != 2 || len(l.Rules("b.example.com").Rules()) != 1 {
		t.Errorf("duplicates: %q", l.Text())
	}
}

func TestTooManyRules(t *testing.T) {
	var b strings.Builder
	for i := range MaxRulesPerName + 1 {
		b.WriteString("a.example.com GET /x")
		b.WriteString(strings.Repeat("/y", i%7) + "/" + strings.Repeat("z", 1+i/7) + "\n")
	}
	if _, err := Parse(strings.NewReader(b.String()), "f"); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Errorf("Parse of %d rules for one name: %v", MaxRulesPerName+1, err)
	}
}

func mustLine(t *testing.T, s string) Line {
	t.Helper()
	ln, err := ParseLine(s)
	if err != nil {
		t.Fatalf("ParseLine(%q): %v", s, err)
	}
	return ln
}

func TestWidenings(t *testing.T) {
	tests := []struct {
		name, prev, next string
		want             []string // entries that widen
	}{
		{"same", ruledList, ruledList, nil},
		{"empty to empty", "", "", nil},
		{"a name added", "a.example.com\n", "a.example.com\nb.example.com GET /\n", []string{"b.example.com"}},
		{"a name removed", "a.example.com\nb.example.com\n", "a.example.com\n", nil},
		{"rules added to a name", "a.example.com\n", "a.example.com GET /**\n", nil},
		{"a rule narrowed", "a.example.com GET /**\n", "a.example.com GET /repos/acme/**\n", nil},
		{"a rule dropped", "a.example.com GET /**\na.example.com POST /x\n", "a.example.com GET /**\n", nil},
		{"a rule added", "a.example.com GET /**\n", "a.example.com GET /**\na.example.com POST /x\n", []string{"a.example.com"}},
		{"a rule widened", "a.example.com GET /a/*\n", "a.example.com GET /a/**\n", []string{"a.example.com"}},
		{"a method added", "a.example.com GET /**\n", "a.example.com GET,PUT /**\n", []string{"a.example.com"}},
		{"a query rule loosened", "a.example.com GET /r?s=1\n", "a.example.com GET /r\n", []string{"a.example.com"}},
		{"rules removed", "a.example.com GET /**\n", "a.example.com\n", []string{"a.example.com"}},
		{"audit to enforced", "a.example.com GET /** audit\n", "a.example.com GET /**\n", nil},
		{"enforced to audit", "a.example.com GET /**\n", "a.example.com GET /** audit\n", nil},
		{"entry put in audit", "a.example.com GET /**\n", "a.example.com GET /**\na.example.com audit\n", []string{"a.example.com"}},
		{"an exact name narrowed below a wildcard", "*.example.com\n", "*.example.com\na.example.com GET /\n", nil},
		{"an exact name wider than its wildcard", "*.example.com GET /\n", "*.example.com GET /\na.example.com GET /**\n", []string{"a.example.com"}},
		{"an exact name dropped under a wider wildcard", "*.example.com\na.example.com GET /\n", "*.example.com\n", []string{"*.example.com"}},
		{"a wildcard's rules widened", "*.example.com GET /\n", "*.example.com GET /**\n", []string{"*.example.com"}},
		{"a wildcard replaced by a wider one", "*.a.example.com GET /\n", "*.example.com GET /\n", []string{"*.example.com"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch := Widenings(mustParse(t, tt.prev), mustParse(t, tt.next))
			var got []string
			for _, c := range ch {
				got = append(got, c.Entry)
				if c.Why == "" {
					t.Errorf("change %+v says nothing", c)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("Widenings = %+v, want entries %v", ch, tt.want)
			}
		})
	}
	if len(Widenings(nil, mustParse(t, "a.example.com\n"))) != 1 || Widenings(mustParse(t, "a.example.com\n"), nil) != nil {
		t.Error("a nil list is the empty list")
	}
}

func TestPresets(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Presets() {
		if seen[p.Name] || p.About == "" || len(p.Lines) == 0 {
			t.Errorf("preset %+v: duplicate, or without text", p)
		}
		seen[p.Name] = true
		if _, err := Parse(strings.NewReader(p.Text()), "preset "+p.Name); err != nil {
			t.Errorf("preset %s does not parse: %v", p.Name, err)
		}
	}
	for _, want := range []string{"github-readonly", "npm-readonly", "pypi-readonly", "goproxy-readonly", "anthropic-api", "openai-api"} {
		if _, ok := PresetByName(want); !ok {
			t.Errorf("no preset %s", want)
		}
	}
	tests := []struct {
		preset, host, method, path, query string
		allowed                           bool
	}{
		// git clone and fetch over smart HTTP, protocol v0 to v2.
		{"github-readonly", "github.com", "GET", "/acme/app.git/info/refs", "service=git-upload-pack", true},
		{"github-readonly", "github.com", "GET", "/acme/app/info/refs", "service=git-upload-pack", true},
		{"github-readonly", "github.com", "POST", "/acme/app.git/git-upload-pack", "", true},
		// git push: neither its discovery nor the pack.
		{"github-readonly", "github.com", "GET", "/acme/app.git/info/refs", "service=git-receive-pack", false},
		{"github-readonly", "github.com", "GET", "/acme/app.git/info/refs", "service=git-upload-pack&service=git-receive-pack", false},
		{"github-readonly", "github.com", "POST", "/acme/app.git/git-receive-pack", "", false},
		{"github-readonly", "github.com", "POST", "/acme/app.git/info/lfs/objects/batch", "", false},
		{"github-readonly", "api.github.com", "GET", "/repos/acme/app/pulls", "", true},
		{"github-readonly", "api.github.com", "POST", "/repos/acme/app/issues", "", false},
		{"github-readonly", "api.github.com", "POST", "/graphql", "", false},
		{"github-readonly", "github.com", "GET", "/acme/app/archive/refs/heads/main.tar.gz", "", true},
		{"github-readonly", "github.com", "GET", "/login", "", false},
		{"npm-readonly", "registry.npmjs.org", "GET", "/@scope%2fname", "", true},
		{"npm-readonly", "registry.npmjs.org", "GET", "/left-pad/-/left-pad-1.3.0.tgz", "", true},
		{"npm-readonly", "registry.npmjs.org", "PUT", "/left-pad", "", false},
		{"npm-readonly", "registry.npmjs.org", "DELETE", "/left-pad/-rev/1", "", false},
		{"pypi-readonly", "pypi.org", "GET", "/simple/requests/", "", true},
		{"pypi-readonly", "files.pythonhosted.org", "GET", "/packages/ab/cd/requests-2.0.tar.gz", "", true},
		{"pypi-readonly", "pypi.org", "POST", "/legacy/", "", false},
		{"anthropic-api", "api.anthropic.com", "POST", "/v1/messages", "beta=true", true},
		{"anthropic-api", "api.anthropic.com", "POST", "/v1/messages/count_tokens", "", true},
		{"anthropic-api", "api.anthropic.com", "POST", "/v1/files", "", false},
		{"anthropic-api", "api.anthropic.com", "POST", "/v1/messages/../files", "", false},
		{"openai-api", "api.openai.com", "POST", "/v1/responses", "", true},
		{"openai-api", "api.openai.com", "POST", "/v1/files", "", false},
		{"openai-api", "api.openai.com", "POST", "/v1/fine_tuning/jobs", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.preset+" "+tt.method+" "+tt.host+tt.path+"?"+tt.query, func(t *testing.T) {
			p, _ := PresetByName(tt.preset)
			l := mustParse(t, p.Text())
			d := l.Match(tt.host)
			if d.Verdict != Allow {
				t.Fatalf("%s does not list %s", tt.preset, tt.host)
			}
			rd, _ := l.Rules(d.Rule).Check(tt.method, tt.path, tt.query)
			if rd.Allowed != tt.allowed {
				t.Errorf("%s: %+v, want allowed %v", l.Rules(d.Rule), rd, tt.allowed)
			}
		})
	}
}
