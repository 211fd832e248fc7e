package reqrules

import (
	"errors"
	"net/url"
	"strings"
	"testing"
)

// FuzzNormalize: a request path is the guest's. Normalize never panics,
// refuses with ErrNotCanonical, or returns a fixed point that a resolver
// written apart (net/url decoding and path.Clean, cleanOracle) reads as
// the same path as the input, whose bytes net/url keeps when it is sent,
// and which holds nothing a server could read as more structure: no empty
// or dot segment, no encoded unreserved character, no lower-case hex.
func FuzzNormalize(f *testing.F) {
	for _, s := range []string{
		"/", "", "/a/b/../c", "//a//./b/", "/%2e%2E/x", "/a%2fb", "/@s%2Fn", "/a/..;/b", "/a%3B/b",
		"/%C0%AE", "/．．/x", "/a\\b", "/%5c", "/%00", "/a b/é", "/%252e", "/100%25", "/a/.../b",
		"/..%20/", "/a;x=1/b", "/%7e%41", "/?x", "*", "/a%", "/%u002e", "/\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if canonicalASCII(s) {
			if c, err := normalize(s); err != nil || c != s {
				t.Fatalf("the fast path keeps %q, the long way gives %q, %v", s, c, err)
			}
		}
		c, err := Normalize(s)
		if err != nil {
			if !errors.Is(err, ErrNotCanonical) {
				t.Fatalf("Normalize(%q): %v is not ErrNotCanonical", s, err)
			}
			return
		}
		again, err := Normalize(c)
		if err != nil || again != c {
			t.Fatalf("Normalize(%q) = %q, which normalises to %q, %v", s, c, again, err)
		}
		if c[0] != '/' || strings.Contains(c, "//") {
			t.Fatalf("Normalize(%q) = %q: not one slash between segments", s, c)
		}
		for _, seg := range strings.Split(c[1:], "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("Normalize(%q) = %q: a dot segment", s, c)
			}
		}
		for i := 0; i < len(c); i++ {
			b := c[i]
			if b == '%' {
				v, ok1 := unhex(c[i+1])
				w, ok2 := unhex(c[i+2])
				if !ok1 || !ok2 || strings.ToUpper(c[i+1:i+3]) != c[i+1:i+3] || unreserved(v<<4|w) {
					t.Fatalf("Normalize(%q) = %q: escape %q", s, c, c[i:i+3])
				}
				i += 2
				continue
			}
			if !plainInPath(b) {
				t.Fatalf("Normalize(%q) = %q: raw byte %q", s, c, b)
			}
		}
		if want, ok := cleanOracle(s); ok {
			if got, _ := cleanOracle(c); got != want {
				t.Fatalf("Normalize(%q) = %q, read as %q; the input reads as %q", s, c, got, want)
			}
		}
		p, err := url.PathUnescape(c)
		if err != nil {
			t.Fatalf("Normalize(%q) = %q, which net/url cannot decode: %v", s, c, err)
		}
		u := &url.URL{Scheme: "http", Host: "h", Path: p, RawPath: c}
		if u.EscapedPath() != c {
			t.Fatalf("Normalize(%q) = %q, sent by net/url as %q", s, c, u.EscapedPath())
		}
		if pu, err := url.Parse(u.String()); err != nil || pu.EscapedPath() != c {
			t.Fatalf("Normalize(%q) = %q, read back by net/url as %v, %v", s, c, pu, err)
		}
	})
}

// refMatch is matchSegments written the slow, obvious way.
func refMatch(p, s []string) bool {
	if len(p) == 0 {
		return len(s) == 0
	}
	if p[0] == "**" {
		for k := 0; k <= len(s); k++ {
			if refMatch(p[1:], s[k:]) {
				return true
			}
		}
		return false
	}
	return len(s) > 0 && oneSegment(p[0], s[0]) && refMatch(p[1:], s[1:])
}

// FuzzRules: rules come from a repository's files. ParseRule never panics;
// a rule it accepts renders as a String that parses back to an equal rule
// and renders the same again. Matching agrees with a slow reference, a
// rule covers itself, and covers is sound: when a covers b, a request b
// allows a allows too.
func FuzzRules(f *testing.F) {
	for _, s := range [][5]string{
		{"GET,HEAD /**", "GET /repos/acme/**", "GET", "/repos/acme/app", ""},
		{"POST /repos/acme/app/pulls", "POST /repos/*/app/pulls", "POST", "/repos/acme/app/pulls", "x=1"},
		{"PUT /incoming/*", "PUT /incoming/a", "PUT", "/incoming/a/", ""},
		{"GET /*/*/info/refs?service=git-upload-pack", "GET /*/*/info/refs", "GET", "/a/b/info/refs", "service=git-upload-pack"},
		{"GET /**/x/**/y audit", "GET /a/**/y", "GET", "/a/x/b/y", ""},
		{"", "audit", "DELETE", "/a/..;/b", ""},
		{"get /a", "GET,GET /b", "GET", "/a", ""},
		{"GET /a/../b", "GET /a?x&x", "GET", "/%2e%2e", ""},
		{"GET /a/*", "GET /a/**", "GET", "/a/b/c", ""},
		{"GET /**/*", "GET /y/**/x/**", "GET", "/y/x/", ""},
		{"/**", "PUT /*/b/", "PUT", "/a/b/", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, a, b, method, path, query string) {
		ra, err := ParseRule(a)
		if err != nil {
			return
		}
		s := ra.String()
		again, err := ParseRule(s)
		if err != nil || !again.Equal(ra) || again.String() != s {
			t.Fatalf("ParseRule(%q) renders as %q, which parses as %q, %v", a, s, again.String(), err)
		}
		if !ra.covers(ra) {
			t.Fatalf("%q does not cover itself", s)
		}
		tg := NewTarget(path, query, true)
		m := ra.Matches(method, tg)
		if ra.path != "" && tg.PathErr == nil && len(ra.segs) <= 12 && strings.Count(ra.path, "**") <= 4 && len(tg.split) <= 12 {
			if ref := refMatch(ra.segs, tg.split); ref != matchSegments(ra.segs, tg.split) {
				t.Fatalf("%q on %q: matchSegments %v, the reference %v", s, tg.Path, !ref, ref)
			}
		}
		if m && ra.path != "" && tg.PathErr != nil {
			t.Fatalf("%q with a pattern matched %q, which has no canonical form", s, path)
		}
		rb, err := ParseRule(b)
		if err != nil {
			return
		}
		if ra.covers(rb) && rb.Matches(method, tg) && !m {
			t.Fatalf("%q covers %q, but %s %q?%q is allowed by the second alone", s, rb.String(), method, path, query)
		}
		// Random paths seldom match b: take one of b's own instances,
		// with path's segments for its wildcards.
		if rb.path == "" || !ra.covers(rb) {
			return
		}
		inst := NewTarget(instance(rb.segs, strings.Split(path, "/")), strings.Join(rb.query, "&"), true)
		for _, m := range append([]string{method}, knownMethods[:]...) {
			if rb.Matches(m, inst) && !ra.Matches(m, inst) {
				t.Fatalf("%q covers %q, but %s %q?%q is allowed by the second alone", s, rb.String(), m, inst.Path, inst.Query)
			}
		}
	})
}

// instance writes a path that pattern segs matches, taking the words
// for its wildcards in turn ("**" takes none, one or two of them, by the
// word's length).
func instance(segs, words []string) string {
	var out []string
	k := 0
	word := func() string {
		w := ""
		if len(words) > 0 {
			w = words[k%len(words)]
			k++
		}
		if c, err := Normalize("/" + w); err == nil && c != "/" && !strings.Contains(c[1:], "/") {
			return c[1:]
		}
		return "w"
	}
	for _, s := range segs {
		switch s {
		case "*":
			out = append(out, word())
		case "**":
			n := 0
			if len(words) > 0 {
				n = len(words[k%len(words)]) % 3
			}
			for range n {
				out = append(out, word())
			}
		default:
			out = append(out, s)
		}
	}
	return "/" + strings.Join(out, "/")
}
