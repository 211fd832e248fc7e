package allowlist

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParse: an allowlist file can be a hostile repository's. Whatever its
// bytes, Parse refuses it with a bounded list of line errors, or returns
// entries in normal form (each parses back to itself, Format and Parse give
// the same list back, and Text the same lines and rules) that allow exactly
// what they say: a name the list allows is an exact entry, or strictly below
// a wildcard entry's name, and its rules are that entry's.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"example.com\n*.example.org\n# comment\n  api.example.net  # trailing\n",
		"EXAMPLE.com.\nbücher.de\n*.xn--bcher-kva.de\n",
		"*\n*.com\n*.co.uk\n127.0.0.1\nhttp://a.example.com/\na.local\n",
		"*.s3.amazonaws.com\n*.amazonaws.com\n*.kawasaki.jp\n",
		"a..b\n-a.com\n" + strings.Repeat("a", 5000) + "\n",
		"a.example.com\r\nb.example.com\x00\n",
		"api.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls\nuploads.example.com PUT /incoming/*\n",
		"github.com GET /*/*/info/refs?service=git-upload-pack\n*.example.org audit\n*.example.org GET /a/**/b\n",
		"a.example.com\na.example.com GET /\nb.example.com gets /x\nc.example.com GET /a/../b\n",
		"code.example.com\ncode.example.com push refs/heads/agent/*\ncode.example.com push refs/tags/** delete no-create\ngit.example.org GET /**\ngit.example.org push refs/heads/a\n",
		"x.example.com push refs/heads/a\ny.example.com push main\n",
	} {
		f.Add([]byte(s), "x.example.org")
	}
	f.Fuzz(func(t *testing.T, b []byte, q string) {
		l, err := Parse(bytes.NewReader(b), "allow.txt")
		if err != nil {
			if pe, ok := err.(*ParseError); ok && len(pe.Lines) > maxLineErrors+1 {
				t.Fatalf("%d line errors", len(pe.Lines))
			}
			return
		}
		for _, e := range l.Entries() {
			again, err := ParseEntry(e.String())
			if err != nil || again.Name != e.Name || again.Wildcard != e.Wildcard {
				t.Fatalf("%q: the entry %q parses back as %+v, %v", b, e, again, err)
			}
			if d := l.Match(e.Name); d.Verdict != Allow && !e.Wildcard {
				t.Fatalf("%q: the list does not allow its own entry %q", b, e)
			}
		}
		l2, err := Parse(strings.NewReader(Format(l.Entries())), "formatted")
		if err != nil || l2.Len() != l.Len() {
			t.Fatalf("%q: Format gives a list that parses as %d entries (of %d), %v", b, l2.Len(), l.Len(), err)
		}
		for _, e := range l.Entries() {
			if !l2.Contains(e) {
				t.Fatalf("%q: Format lost %q", b, e)
			}
		}
		// Text renders every line, rules included, and parses back to the
		// same entries with the same rules.
		l3, err := Parse(strings.NewReader(l.Text()), "text")
		if err != nil || l3.Text() != l.Text() {
			t.Fatalf("%q: Text %q parses as %v, %v", b, l.Text(), l3, err)
		}
		for _, e := range l.Entries() {
			if got, want := l3.Rules(e.String()).String(), l.Rules(e.String()).String(); got != want {
				t.Fatalf("%q: %s's rules %q come back as %q", b, e, want, got)
			}
			if got, want := l3.Push(e.String()).String(), l.Push(e.String()).String(); got != want {
				t.Fatalf("%q: %s's push rules %q come back as %q", b, e, want, got)
			}
		}
		d := l.Match(q)
		if d.Verdict != Allow {
			return
		}
		if set := l.Rules(d.Rule); set != nil && set.Name() != d.Rule {
			t.Fatalf("%q allows %q by %q, whose rules are %q's", b, q, d.Rule, set.Name())
		}
		if set := l.Push(d.Rule); set != nil && set.Name() != d.Rule {
			t.Fatalf("%q allows %q by %q, whose push rules are %q's", b, q, d.Rule, set.Name())
		}
		n, err := NormalizeName(q)
		if err != nil {
			t.Fatalf("%q allows %q, which does not normalise: %v", b, q, err)
		}
		e, err := ParseEntry(d.Rule)
		if err != nil || !l.Contains(e) {
			t.Fatalf("%q allows %q by the rule %q, which is not an entry", b, q, d.Rule)
		}
		if e.Wildcard && !strings.HasSuffix(n, "."+e.Name) || !e.Wildcard && n != e.Name {
			t.Fatalf("%q allows %q (%s) by %q, which does not cover it", b, q, n, d.Rule)
		}
	})
}
