package reqrules

import (
	"testing"
)

func mustSet(t *testing.T, name string, rules ...string) *Set {
	t.Helper()
	var rs []Rule
	for _, s := range rules {
		r, err := ParseRule(s)
		if err != nil {
			t.Fatalf("ParseRule(%q): %v", s, err)
		}
		rs = append(rs, r)
	}
	return NewSet(name, rs)
}

// The example: reads of the whole API, one POST.
func TestCheck(t *testing.T) {
	s := mustSet(t, "api.github.com", "GET,HEAD /**", "POST /repos/acme/app/pulls")
	tests := []struct {
		method, path, query string
		allowed             bool
		reason, rule        string
	}{
		{"GET", "/repos/acme/app", "", true, "", "GET,HEAD /**"},
		{"HEAD", "/", "", true, "", "GET,HEAD /**"},
		{"GET", "/anything?x", "", false, ReasonPathNotCanonical, ""},
		{"POST", "/repos/acme/app/pulls", "", true, "", "POST /repos/acme/app/pulls"},
		{"POST", "/repos/acme/app/pulls", "draft=1", true, "", "POST /repos/acme/app/pulls"},
		{"POST", "//repos/./acme/%61pp/pulls", "", true, "", "POST /repos/acme/app/pulls"},
		{"POST", "/repos/acme/app/pulls/", "", false, ReasonPathNotAllowed, ""},
		{"POST", "/repos/acme/app/issues", "", false, ReasonPathNotAllowed, ""},
		{"POST", "/repos/acme/app/pulls/../../other/pulls", "", false, ReasonPathNotAllowed, ""},
		{"POST", "/repos/acme/app/pulls/..;/x", "", false, ReasonPathNotCanonical, ""},
		{"POST", "/repos/acme/app/pulls%2F..%2F..%2Fother", "", false, ReasonPathNotCanonical, ""},
		{"DELETE", "/repos/acme/app", "", false, ReasonMethodNotAllowed, ""},
		{"DELETE", "/repos/acme/app/..;/x", "", false, ReasonMethodNotAllowed, ""}, // the method first
		{"get", "/repos/acme/app", "", false, ReasonMethodNotAllowed, ""},          // methods are case-sensitive
		{"PROPFIND", "/", "", false, ReasonMethodNotAllowed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			d, _ := s.Check(tt.method, tt.path, tt.query)
			if d.Allowed != tt.allowed || d.Reason != tt.reason || d.Rule != tt.rule || d.WouldDeny != "" {
				t.Errorf("Check = %+v, want allowed %v reason %q rule %q", d, tt.allowed, tt.reason, tt.rule)
			}
			if d.Set != "api.github.com" {
				t.Errorf("Check names the set %q, want api.github.com", d.Set)
			}
			if (d.Reason == ReasonPathNotCanonical) != (d.Detail != "") {
				t.Errorf("Check detail %q with reason %q", d.Detail, d.Reason)
			}
		})
	}
}

func TestNilSetAllowsEverything(t *testing.T) {
	var s *Set
	d, tg := s.Check("PROPFIND", "/a/..;/b%zz", "q=%")
	if !d.Allowed || d.Reason != "" || tg.Path != "/a/..;/b%zz" || tg.Query != "q=%" {
		t.Errorf("nil set: %+v, %+v; want allowed and the request's own path and query", d, tg)
	}
	if NewSet("h", nil) != nil {
		t.Error("NewSet without rules is not the nil set")
	}
}

func TestRuleWithoutPattern(t *testing.T) {
	s := mustSet(t, "uploads.example.com", "POST", "GET /a")
	// POST anywhere, canonical or not: the rule does not look at the path,
	// and the path goes upstream as received.
	d, tg := s.Check("POST", "/x/..;/y", "")
	if !d.Allowed || d.Rule != "POST" || tg.Path != "/x/..;/y" || tg.PathErr == nil {
		t.Errorf("POST on a non-canonical path: %+v, %+v", d, tg)
	}
	d, tg = s.Check("POST", "/x/../y", "")
	if !d.Allowed || tg.Path != "/y" {
		t.Errorf("POST on a canonical path: %+v, %+v; want it sent as /y", d, tg)
	}
	if d, _ := s.Check("GET", "/a/..;/b", ""); d.Allowed || d.Reason != ReasonPathNotCanonical {
		t.Errorf("GET on a non-canonical path: %+v", d)
	}
}

func TestAudit(t *testing.T) {
	// Narrowing GET /** to GET /repos/acme/**, GET /** kept as audit.
	s := mustSet(t, "api.github.com", "GET /repos/acme/**", "GET /** audit")
	tests := []struct {
		method, path        string
		allowed             bool
		reason, would, rule string
	}{
		{"GET", "/repos/acme/app", true, "", "", "GET /repos/acme/**"},
		{"GET", "/repos/other/x", true, "", ReasonPathNotAllowed, "GET /** audit"},
		{"GET", "/a/..;/b", false, ReasonPathNotCanonical, "", ""},
		{"POST", "/repos/acme/app", false, ReasonMethodNotAllowed, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			d, _ := s.Check(tt.method, tt.path, "")
			if d.Allowed != tt.allowed || d.Reason != tt.reason || d.WouldDeny != tt.would || d.Rule != tt.rule {
				t.Errorf("Check = %+v, want allowed %v reason %q would_deny %q rule %q", d, tt.allowed, tt.reason, tt.would, tt.rule)
			}
		})
	}

	// A whole entry in audit: "audit" alone is the rule that allows
	// everything, as audit.
	e := mustSet(t, "registry.example.org", "GET /**", "audit")
	for _, tt := range []struct {
		method, path, would string
	}{
		{"GET", "/x", ""},
		{"PUT", "/x", ReasonMethodNotAllowed},
		{"GET", "/x/..;/y", ReasonPathNotCanonical},
	} {
		d, _ := e.Check(tt.method, tt.path, "")
		if !d.Allowed || d.WouldDeny != tt.would {
			t.Errorf("audit entry: %s %s = %+v, want allowed, would_deny %q", tt.method, tt.path, d, tt.would)
		}
	}

	// An audit rule names a method: a request it does not match is refused
	// for its path, not its method.
	a := mustSet(t, "h", "GET /x audit")
	if d, _ := a.Check("GET", "/y", ""); d.Allowed || d.Reason != ReasonPathNotAllowed {
		t.Errorf("GET /y under GET /x audit: %+v, want path_not_allowed", d)
	}
	if d, _ := a.Check("GET", "/x", ""); !d.Allowed || d.WouldDeny != ReasonMethodNotAllowed {
		t.Errorf("GET /x under GET /x audit: %+v, want allowed, would_deny method_not_allowed", d)
	}
}

func TestSetDedupesAndSummarises(t *testing.T) {
	s := mustSet(t, "h", "GET /a", "GET /a", "", "POST /b audit")
	if len(s.Rules()) != 3 {
		t.Errorf("Rules = %v, want 3 distinct", s.Rules())
	}
	if got, want := s.String(), "GET /a; (everything); POST /b audit"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestQueryCanonicalisedOnlyWhenLookedAt(t *testing.T) {
	_, tg := mustSet(t, "h", "GET /**").Check("GET", "/a", "sig=%2f%7e")
	if tg.Query != "sig=%2f%7e" {
		t.Errorf("a set without query rules sent the query as %q, want it untouched", tg.Query)
	}
	_, tg = mustSet(t, "h", "GET /**", "GET /x?a=1").Check("GET", "/a", "sig=%2f%7e")
	if tg.Query != "sig=%2F~" {
		t.Errorf("a set with a query rule sent the query as %q, want the canonical sig=%%2F~", tg.Query)
	}
}
