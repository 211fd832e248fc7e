package policy

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestAddRemoveRules: rule lines are added and removed as lines, the
// file keeping its comments and order; a name removes all its rules, a
// rule line just itself, and a name whose last rule goes is gone.
func TestAddRemoveRules(t *testing.T) {
	const start = "# top comment\nexample.com\napi.github.com GET,HEAD /** # reads\n# tail comment\n"
	e := newEngine(t, start)
	added, err := e.Add("api.github.com POST /repos/acme/app/pulls", "API.github.com HEAD,GET /**", "registry.example.org GET /** audit")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := fmt.Sprint(added), "[api.github.com POST /repos/acme/app/pulls registry.example.org GET /** audit]"; got != want {
		t.Errorf("added = %s, want %s (a rule in force is not added twice)", got, want)
	}
	// A name's new rule goes after its last line; a new name at the end.
	want := "# top comment\nexample.com\napi.github.com GET,HEAD /** # reads\napi.github.com POST /repos/acme/app/pulls\n# tail comment\nregistry.example.org GET /** audit\n"
	if data, _ := os.ReadFile(e.Path()); string(data) != want {
		t.Errorf("file after add:\n%s\nwant:\n%s", data, want)
	}
	if got := e.List().Rules("api.github.com").String(); got != "GET,HEAD /**; POST /repos/acme/app/pulls" {
		t.Errorf("rules in force = %q", got)
	}

	removed, err := e.Remove("api.github.com POST /repos/acme/app/pulls")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(removed) != "[api.github.com POST /repos/acme/app/pulls]" {
		t.Errorf("removed = %v", removed)
	}
	if got := e.List().Rules("api.github.com").String(); got != "GET,HEAD /**" {
		t.Errorf("one rule removed, rules in force = %q", got)
	}
	if _, err := e.Remove("api.github.com PUT /**"); err == nil || !strings.Contains(err.Error(), "not listed: api.github.com PUT /**") {
		t.Errorf("removing a rule not listed: %v", err)
	}
	// The last rule going takes the name with it: no fallback to
	// everything.
	if _, err := e.Remove("api.github.com GET,HEAD /**"); err != nil {
		t.Fatal(err)
	}
	if e.Decide("api.github.com").Verdict != "block" {
		t.Errorf("a name whose last rule was removed is still allowed: %+v", e.Decide("api.github.com"))
	}
	// A name alone removes all its rules.
	if _, err := e.Add("registry.example.org HEAD /**"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Remove("registry.example.org"); err != nil {
		t.Fatal(err)
	}
	want = "# top comment\nexample.com\n# tail comment\n"
	if data, _ := os.ReadFile(e.Path()); string(data) != want {
		t.Errorf("file after removes:\n%s\nwant:\n%s", data, want)
	}
}

// TestAddKeepsAFileWithoutFinalNewline: a last line without its newline
// is not joined to the line added after it.
func TestAddKeepsAFileWithoutFinalNewline(t *testing.T) {
	e := newEngine(t, "a.example.com GET /")
	if _, err := e.Add("a.example.com POST /x", "b.example.com"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(e.Path()); string(data) != "a.example.com GET /\na.example.com POST /x\nb.example.com\n" {
		t.Errorf("file = %q", data)
	}
}

// TestAddRefusesRulesConflicts: a name cannot be both with and without
// rules; the error says which and how to get there, and nothing changes.
func TestAddRefusesRulesConflicts(t *testing.T) {
	const start = "open.example.com\nruled.example.com GET /**\n"
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
	}{
		{"a rule for a name without rules", []string{"open.example.com GET /"}, "open.example.com is listed without rules, which allows everything on it, so the rule would not count: to restrict it to rules, remove the name first"},
		{"no rules for a name with rules", []string{"ruled.example.com"}, "ruled.example.com is listed with rules (GET /**), and a line without rules would allow everything on it, so the rules would not count: to allow everything, remove the name first"},
		{"both in one add", []string{"new.example.com", "new.example.com GET /"}, "new.example.com is given both with and without rules"},
		{"a bad rule", []string{"new.example.com", "new.example.com FETCH /"}, `"FETCH" is not a method`},
		{"a comment", []string{"new.example.com GET / # x"}, "one line, without # comments"},
		{"two lines", []string{"new.example.com\nother.example.com"}, "one line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, start)
			_, err := e.Add(tc.lines...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant %q", err, tc.want)
			}
			var ce *RulesConflictError
			if strings.Contains(tc.name, "rules") && !errors.As(err, &ce) {
				t.Errorf("%T is not a *RulesConflictError", err)
			}
			if data, _ := os.ReadFile(e.Path()); string(data) != start {
				t.Errorf("a refused add changed the file:\n%s", data)
			}
			if e.Decide("new.example.com").Verdict != "block" || e.List().Rules("open.example.com") != nil {
				t.Errorf("a refused add changed the list in force")
			}
		})
	}
}
