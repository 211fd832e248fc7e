package allowlist

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzParse: an allowlist file can be a hostile repository's. Whatever its
// bytes, Parse refuses it with a bounded list of line errors, or returns
// entries in normal form (each parses back to itself, Format and Parse give
// the same list back) that allow exactly what they say: a name the list
// allows is an exact entry, or strictly below a wildcard entry's name.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"example.com\n*.example.org\n# comment\n  api.example.net  # trailing\n",
		"EXAMPLE.com.\nbücher.de\n*.xn--bcher-kva.de\n",
		"*\n*.com\n*.co.uk\n127.0.0.1\nhttp://a.example.com/\na.local\n",
		"*.s3.amazonaws.com\n*.amazonaws.com\n*.kawasaki.jp\n",
		"a..b\n-a.com\n" + strings.Repeat("a", 5000) + "\n",
		"a.example.com\r\nb.example.com\x00\n",
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
		d := l.Match(q)
		if d.Verdict != Allow {
			return
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
