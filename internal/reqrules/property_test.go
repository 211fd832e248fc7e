package reqrules

import (
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"
)

// segAlphabet is what generated segments are made of: unreserved
// characters, the reserved ones a path may hold, and escapes.
var segAlphabet = []string{
	"a", "b", "Z", "0", "9", "-", ".", "_", "~",
	"!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=", ":", "@",
	"%3F", "%23", "%25", "%20", "%C3%A9", "%E6%97%A5", "%3B", "%7B", "%2F",
}

// canonicalPath returns a random path Normalize keeps as it is.
func canonicalPath(rng *rand.Rand) string {
	for {
		var b strings.Builder
		n := rng.IntN(5)
		for range n {
			b.WriteByte('/')
			for range 1 + rng.IntN(6) {
				b.WriteString(segAlphabet[rng.IntN(len(segAlphabet))])
			}
		}
		if n == 0 || rng.IntN(4) == 0 {
			b.WriteByte('/')
		}
		p := b.String()
		if c, err := Normalize(p); err == nil && c == p {
			return p
		}
	}
}

func hexCase(rng *rand.Rand, s string) string {
	if rng.IntN(2) == 0 {
		return strings.ToLower(s)
	}
	return s
}

// respell writes canonical differently and equivalently: unreserved
// characters encoded, hex in either case, raw bytes for escapes a path
// may also hold raw, and "/./", "/x/../", "//" and encoded dot segments
// put in between segments.
func respell(rng *rand.Rand, canonical string) string {
	segs := strings.Split(canonical[1:], "/")
	var b strings.Builder
	noise := func() {
		for rng.IntN(3) == 0 {
			switch rng.IntN(6) {
			case 0:
				b.WriteString("/")
			case 1:
				b.WriteString("./")
			case 2:
				b.WriteString(hexCase(rng, "%2E/"))
			case 3:
				b.WriteString("junk" + fmt.Sprint(rng.IntN(9)) + "/../")
			case 4:
				b.WriteString("a/" + hexCase(rng, "%2E%2E") + "/")
			case 5:
				b.WriteString("x/./y/../../")
			}
		}
	}
	b.WriteByte('/')
	for i, s := range segs {
		noise()
		for j := 0; j < len(s); j++ {
			c := s[j]
			switch {
			case c == '%':
				esc := s[j : j+3]
				v, _ := url.PathUnescape(esc)
				// A byte the path may not hold raw, or a non-ASCII one,
				// may be sent raw: Normalize encodes it.
				if (v[0] >= 0x80 || v == " " || v == "{") && rng.IntN(2) == 0 {
					b.WriteString(v)
				} else {
					b.WriteString(hexCase(rng, esc))
				}
				j += 2
			case unreserved(c) && rng.IntN(3) == 0:
				b.WriteString(hexCase(rng, fmt.Sprintf("%%%02X", c)))
			default:
				b.WriteByte(c)
			}
		}
		if i < len(segs)-1 {
			b.WriteByte('/')
		}
	}
	if strings.HasSuffix(canonical, "/") && canonical != "/" {
		// A trailing "/" may also be written "/." or "//".
		switch rng.IntN(3) {
		case 0:
			b.WriteString(".")
		case 1:
			b.WriteString("/")
		}
	}
	return b.String()
}

// Every spelling of one path is one canonical path, decides the same under
// every rule set, and is sent upstream as that canonical path.
func TestEverySpellingDecidesTheSame(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 18))
	sets := []*Set{
		mustSet(t, "a", "GET,HEAD /**", "POST /a/b"),
		mustSet(t, "b", "GET /*/*", "PUT /*/", "DELETE /**/Z"),
		mustSet(t, "c", "GET /a/** audit", "POST /*/**/b"),
	}
	methods := []string{"GET", "HEAD", "POST", "PUT", "DELETE"}
	// Both verdicts must be common, or the property says little.
	verdicts := map[bool]int{}
	ownAllowed := 0
	for i := range 3000 {
		c := canonicalPath(rng)
		// Decisions of the canonical path itself, for comparison; patterns
		// from its own segments make matches likely.
		var rules []Rule
		for _, r := range []string{"GET " + c, "POST " + c[:strings.LastIndexByte(c, '/')] + "/**"} {
			if r, err := ParseRule(r); err == nil {
				rules = append(rules, r)
			}
		}
		check := sets
		if own := NewSet("own", rules); own != nil {
			check = append(check[:len(check):len(check)], own)
		}
		for range 4 {
			sp := respell(rng, c)
			got, err := Normalize(sp)
			if err != nil || got != c {
				t.Fatalf("case %d: Normalize(%q) = %q, %v; want %q, the spelling's canonical path", i, sp, got, err, c)
			}
			for _, s := range check {
				for _, m := range methods {
					want, _ := s.Check(m, c, "")
					d, tg := s.Check(m, sp, "")
					verdicts[d.Allowed]++
					if d.Allowed && s.Name() == "own" {
						ownAllowed++
					}
					if d != want {
						t.Fatalf("case %d: set %s: %s %q decides %+v, its canonical %q %+v", i, s.Name(), m, sp, d, c, want)
					}
					if tg.Path != c {
						t.Fatalf("case %d: %q would go upstream as %q, decided as %q", i, sp, tg.Path, c)
					}
					u := &url.URL{Scheme: "http", Host: "h"}
					tg.SetURL(u)
					if u.EscapedPath() != c || u.RequestURI() != c {
						t.Fatalf("case %d: %q goes upstream as %q (%q), decided as %q", i, sp, u.EscapedPath(), u.RequestURI(), c)
					}
				}
			}
		}
	}
	if verdicts[true] < 10000 || verdicts[false] < 10000 || ownAllowed < 3000 {
		t.Errorf("verdicts %v, %d allowed by a path's own rules: the generator misses one side", verdicts, ownAllowed)
	}
}

// The generator must reach the cases the property is about.
func TestRespellCoversTheForms(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 18))
	seen := map[string]bool{}
	for range 3000 {
		c := canonicalPath(rng)
		sp := respell(rng, c)
		for _, f := range []string{"/./", "/../", "//", "%2e", "%2E", "%2F", "%2f", "%61", "é", "%c3"} {
			if strings.Contains(sp, f) {
				seen[f] = true
			}
		}
		if sp != c {
			seen["differs"] = true
		}
	}
	for _, f := range []string{"/./", "/../", "//", "%2e", "%2E", "%2F", "%2f", "%61", "é", "%c3", "differs"} {
		if !seen[f] {
			t.Errorf("no spelling holds %q", f)
		}
	}
}

// covers is sound: when one rule covers another, every path the other
// matches it matches too. Patterns and paths come from a small alphabet
// so that containments, and near misses, are common.
func TestCoversIsSound(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 19))
	pattern := func() string {
		var f []string
		for range rng.IntN(5) {
			f = append(f, []string{"x", "y", "*", "**"}[rng.IntN(4)])
		}
		p := "/" + strings.Join(f, "/")
		if rng.IntN(5) == 0 && p != "/" {
			p += "/"
		}
		return p
	}
	path := func() string {
		var f []string
		for range rng.IntN(6) {
			f = append(f, []string{"x", "y", "z", "a%2Fb"}[rng.IntN(4)])
		}
		p := "/" + strings.Join(f, "/")
		if rng.IntN(4) == 0 && p != "/" {
			p += "/"
		}
		return p
	}
	covered := 0
	for range 20000 {
		a, errA := ParseRule("GET " + pattern())
		b, errB := ParseRule("GET " + pattern())
		if errA != nil || errB != nil || !a.covers(b) {
			continue
		}
		covered++
		for range 20 {
			tg := NewTarget(path(), "", false)
			if b.Matches("GET", tg) && !a.Matches("GET", tg) {
				t.Fatalf("%s covers %s, but only the second matches %s", a, b, tg.Path)
			}
		}
	}
	if covered < 2000 {
		t.Errorf("only %d covering pairs: the generator says little", covered)
	}
}

// naiveDecide is Decide as the rules read, one rule after another: the
// reference for the indexed Decide.
func naiveDecide(s *Set, method string, t Target) Decision {
	methodAny, methodEnforced := false, false
	audit := -1
	for i, r := range s.rules {
		if !r.allowsMethod(method) {
			continue
		}
		methodAny = true
		if !r.audit {
			methodEnforced = true
		}
		if !r.Matches(method, t) {
			continue
		}
		if !r.audit {
			return Decision{Allowed: true, Rule: r.String(), Set: s.name}
		}
		if audit < 0 {
			audit = i
		}
	}
	if audit >= 0 {
		reason, detail := refusal(methodEnforced, t)
		return Decision{Allowed: true, WouldDeny: reason, Rule: s.rules[audit].String(), Set: s.name, Detail: detail}
	}
	reason, detail := refusal(methodAny, t)
	return Decision{Reason: reason, Set: s.name, Detail: detail}
}

// TestIndexedDecideIsNaive: Decide, which tries a request against the
// rules of its first segment and the rest only, decides as trying every
// rule in order would, audit rules and reasons included.
func TestIndexedDecideIsNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 20))
	methods := []string{"GET", "POST", "DELETE", "PATCH", "get"}
	rule := func() string {
		var f []string
		if rng.IntN(3) > 0 {
			f = append(f, []string{"GET", "POST", "GET,POST", "DELETE"}[rng.IntN(4)])
		}
		if rng.IntN(4) > 0 {
			var segs []string
			for range rng.IntN(4) {
				segs = append(segs, []string{"x", "y", "*", "**"}[rng.IntN(4)])
			}
			f = append(f, "/"+strings.Join(segs, "/"))
		}
		if rng.IntN(4) == 0 {
			f = append(f, "audit")
		}
		return strings.Join(f, " ")
	}
	paths := []string{"/", "/x", "/y", "/x/y", "/y/x/x", "/z", "/x/", "/a%2Fb/x", "/..;/x", "/x/y/z/x"}
	decided := map[bool]int{}
	for range 3000 {
		var rs []Rule
		for range 1 + rng.IntN(8) {
			if r, err := ParseRule(rule()); err == nil {
				rs = append(rs, r)
			}
		}
		s := NewSet("h", rs)
		if s == nil {
			continue
		}
		for range 10 {
			m, p := methods[rng.IntN(len(methods))], paths[rng.IntN(len(paths))]
			tg := NewTarget(p, "", false)
			got, want := s.Decide(m, tg), naiveDecide(s, m, tg)
			if got != want {
				t.Fatalf("rules %s: %s %s decides %+v, one rule after another %+v", s, m, p, got, want)
			}
			decided[got.Allowed]++
		}
	}
	if decided[true] < 3000 || decided[false] < 3000 {
		t.Errorf("decisions %v: the generator misses one side", decided)
	}
}
