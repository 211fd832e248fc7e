package reqrules

import (
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"GET", "GET"},
		{"HEAD,GET", "GET,HEAD"}, // methods render in one order
		{"GET,HEAD /**", "GET,HEAD /**"},
		{"POST /repos/acme/app/pulls", "POST /repos/acme/app/pulls"},
		{"PUT /incoming/*", "PUT /incoming/*"},
		{"/incoming/**", "/incoming/**"},
		{"OPTIONS,DELETE,PATCH,PUT,POST,HEAD,GET /", "GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS /"},
		{"GET /a/ audit", "GET /a/ audit"},
		{"audit", "audit"},
		{"  GET   /x\taudit ", "GET /x audit"},
		{"GET /*/*/info/refs?service=git-upload-pack", "GET /*/*/info/refs?service=git-upload-pack"},
		{"GET /x?b=2&a=1", "GET /x?a=1&b=2"}, // pairs are a set
		{"GET /x?flag", "GET /x?flag"},
		{"GET /**/raw/*", "GET /**/raw/*"},
		{"GET /%C3%A9t%C3%A9/a%3B", "GET /%C3%A9t%C3%A9/a%3B"},
		{"GET /a:b@c", "GET /a:b@c"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := ParseRule(tt.in)
			if err != nil {
				t.Fatalf("ParseRule(%q): %v", tt.in, err)
			}
			if got := r.String(); got != tt.want {
				t.Errorf("ParseRule(%q).String() = %q, want %q", tt.in, got, tt.want)
			}
			again, err := ParseRule(r.String())
			if err != nil || !again.Equal(r) {
				t.Errorf("%q parses back as %q, %v", r.String(), again.String(), err)
			}
		})
	}
}

func TestParseRuleRejects(t *testing.T) {
	tests := []struct{ in, why string }{
		{"GETS /x", "not a method a rule may name"},
		{"get /x", "case-sensitive; write GET"},
		{"TRACE /x", "not a method"},
		{"CONNECT", "not a method"},
		{"PROPFIND /x", "not a method"},
		{"GET,,HEAD /x", "empty method"},
		{"GET, /x", "empty method"},
		{"GET,GET /x", "GET twice"},
		{"*", "not a method"},
		{"GET x", "starts with /"},
		{"GET /x /y", "unexpected"},
		{"GET /x audit audit", "last word"},
		{"audit GET", "not a method"},
		{"GET /x extra", "unexpected"},
		{"GET /a/../b", "not a canonical path; write it as \"/b\""},
		{"GET /a//b", "empty segment"},
		{"GET /a/./b", "not a canonical path"},
		{"GET /%61", `write it as "/a"`},
		{"GET /a%3b", `write it as "/a%3B"`},
		{"GET /a%2Fb", "encoded slash"},
		{"GET /a%5Cb", "backslash"},
		{"GET /a\\b", "backslash"},
		{"GET /a%00", "control"},
		{"GET /a..;/b", ""},
		{"GET /..;/b", "drops ;parameters"},
		{"GET /a*", "whole segments"},
		{"GET /*.git", "whole segments"},
		{"GET /a/***", "whole segments"},
		{"GET /**/**", "twice in a row"},
		{"GET /x?", "nothing after ?"},
		{"GET /x?a=1&&b=2", "empty pair"},
		{"GET /x?a=1&a=1", "twice"},
		{"GET /x?a=%7e", `write it as "a=~"`},
		{"GET /x?a=%zz", "two hex digits"},
		{"GET /x#f", "fragment"},
		{"GET /" + strings.Repeat("a", MaxPatternBytes), "longer than"},
		{"GET /é", `write it as "/%C3%A9"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			r, err := ParseRule(tt.in)
			if tt.why == "" {
				// "a..;" is a name with a parameter, not a dot segment.
				if err != nil {
					t.Fatalf("ParseRule(%q): %v", tt.in, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseRule(%q) = %q, want an error saying %q", tt.in, r, tt.why)
			}
			if !strings.Contains(err.Error(), tt.why) {
				t.Errorf("ParseRule(%q) error = %q, want it to say %q", tt.in, err, tt.why)
			}
		})
	}
}

func TestMatchSegments(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"/**", "/", true},
		{"/**", "/a/b/c/", true},
		{"/**", "/@s%2Fn", true},
		{"/*", "/", false}, // * is one non-empty segment
		{"/*", "/a", true},
		{"/*", "/a/", false},
		{"/*", "/a/b", false},
		{"/*", "/@s%2Fn", false}, // an encoded slash only matches **
		{"/*/", "/a/", true},
		{"/", "/", true},
		{"/", "/a", false},
		{"/a/", "/a", false},
		{"/a", "/a/", false},
		{"/repos/**", "/repos", true}, // ** takes none
		{"/repos/**", "/repos/", true},
		{"/repos/**", "/repos/a/b", true},
		{"/repos/**", "/reposx", false},
		{"/repos/**", "/Repos/a", false}, // case-sensitive
		{"/incoming/*", "/incoming/x", true},
		{"/incoming/*", "/incoming/", false},
		{"/incoming/*", "/incoming/x/y", false},
		{"/**/raw/*", "/raw/x", true},
		{"/**/raw/*", "/a/b/raw/x", true},
		{"/**/raw/*", "/a/b/raw/x/y", false},
		{"/**/raw/*", "/a/raw/b/raw/x", true},
		{"/a/**/b/**/c", "/a/b/c", true},
		{"/a/**/b/**/c", "/a/x/b/y/z/c", true},
		{"/a/**/b/**/c", "/a/x/c", false},
		{"/a/**/c", "/a/x%2Fy/c", true},
		{"/a/*/c", "/a/x%2Fy/c", false},
		{"/*/*/git-upload-pack", "/acme/app.git/git-upload-pack", true},
		{"/*/*/git-upload-pack", "/acme/app.git/git-receive-pack", false},
		{"/a;v=1", "/a;v=1", true},
		{"/a", "/a;v=1", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+" "+tt.path, func(t *testing.T) {
			r := MustParseRule(tt.pattern)
			tg := NewTarget(tt.path, "", false)
			if tg.PathErr != nil {
				t.Fatalf("NewTarget(%q): %v", tt.path, tg.PathErr)
			}
			if got := r.Matches("GET", tg); got != tt.want {
				t.Errorf("%s matches %s = %v, want %v", tt.pattern, tt.path, got, tt.want)
			}
		})
	}
}

func TestQueryRules(t *testing.T) {
	r := MustParseRule("GET /*/*/info/refs?service=git-upload-pack")
	tests := []struct {
		query string
		want  bool
	}{
		{"service=git-upload-pack", true},
		{"service=git%2Dupload%2dpack", true}, // unreserved, decoded
		{"service=git-receive-pack", false},
		{"", false},
		{"service=git-upload-pack&service=git-receive-pack", false}, // servers differ on which one counts
		{"service=git-receive-pack&service=git-upload-pack", false},
		{"service=git-upload-pack&x=1", false},
		{"service=git-upload-pack;service=git-receive-pack", false},
		{"service=git-upload-pack&", false},
		{"Service=git-upload-pack", false},
		{"service=git-upload-pack%", false}, // no canonical query
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			tg := NewTarget("/acme/app.git/info/refs", tt.query, true)
			if got := r.Matches("GET", tg); got != tt.want {
				t.Errorf("%s matches ?%s = %v, want %v", r, tt.query, got, tt.want)
			}
		})
	}
	two := MustParseRule("GET /x?a=1&b=2")
	for q, want := range map[string]bool{"a=1&b=2": true, "b=2&a=1": true, "a=1": false, "a=1&b=2&b=2": false} {
		if got := two.Matches("GET", NewTarget("/x", q, true)); got != want {
			t.Errorf("%s matches ?%s = %v, want %v", two, q, got, want)
		}
	}
	// A rule without a query does not look at it.
	if !MustParseRule("GET /x").Matches("GET", NewTarget("/x", "anything=%zz", false)) {
		t.Errorf("a rule without a query refused a request for its query")
	}
}

func TestCovers(t *testing.T) {
	tests := []struct {
		wide, narrow string
		want         bool
	}{
		{"", "GET /x", true},
		{"", "", true},
		{"GET", "GET /x", true},
		{"GET /**", "GET", false}, // a rule without a pattern takes non-canonical paths too
		{"GET /**", "GET /x", true},
		{"GET /**", "GET,HEAD /x", false},
		{"GET,HEAD /**", "HEAD /x", true},
		{"GET /x", "/x", false}, // any method is wider
		{"/x", "DELETE /x", true},
		{"GET /**", "GET /a/**", true},
		{"GET /a/**", "GET /**", false},
		{"GET /a/*", "GET /a/b", true},
		{"GET /a/*", "GET /a/*", true},
		{"GET /a/*", "GET /a/**", false},
		{"GET /a/*", "GET /a/", false},
		{"GET /a/**", "GET /a/*/b/**", true},
		{"GET /**/b", "GET /a/b", true},
		{"GET /**/b", "GET /a/*/b", true},
		{"GET /**/b", "GET /a/b/c", false},
		{"GET /*/*/info/refs", "GET /*/*/info/refs?service=git-upload-pack", true},
		{"GET /*/*/info/refs?service=git-upload-pack", "GET /*/*/info/refs", false},
		{"GET /x?a=1", "GET /x?a=2", false},
		{"GET /x?a=1", "GET /x?a=1", true},
		{"GET /x audit", "GET /x", true}, // audit rules allow
		{"GET /x", "GET /x audit", true},
	}
	for _, tt := range tests {
		t.Run(tt.wide+" ⊇ "+tt.narrow, func(t *testing.T) {
			w, n := MustParseRule(tt.wide), MustParseRule(tt.narrow)
			if got := NewSet("h", []Rule{w}).Covers(NewSet("h", []Rule{n})); got != tt.want {
				t.Errorf("Covers = %v, want %v", got, tt.want)
			}
		})
	}
	set := func(rules ...string) *Set {
		var rs []Rule
		for _, r := range rules {
			rs = append(rs, MustParseRule(r))
		}
		return NewSet("h", rs)
	}
	if !set("GET /a/**", "POST /b").Covers(set("POST /b", "GET /a/x")) {
		t.Error("a set does not cover a subset of its rules")
	}
	if set("GET /a/**").Covers(set("GET /a/x", "POST /a/x")) {
		t.Error("a set covers a set with a method it does not name")
	}
	if set("GET /**").Covers(nil) || !(*Set)(nil).Covers(set("GET /x")) || !set("").Covers(nil) {
		t.Error("nil is the set that allows everything")
	}
}
