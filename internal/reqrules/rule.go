// Package reqrules is the request-level policy for one host: rules of
// methods and path patterns, matched against one canonical form of the
// path that is also the form sent upstream.
package reqrules

import (
	"fmt"
	"slices"
	"strings"
)

// Methods a rule may name. Others (TRACE, CONNECT, WebDAV's, QUERY) are
// errors in a rule: a request with one is allowed only by a rule that names
// no methods.
var knownMethods = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

// methodSet is a bit set over knownMethods; 0 means any method.
type methodSet uint8

func methodBit(m string) methodSet {
	for i, k := range knownMethods {
		if k == m {
			return 1 << i
		}
	}
	return 0
}

func (s methodSet) String() string {
	var names []string
	for i, k := range knownMethods {
		if s&(1<<i) != 0 {
			names = append(names, k)
		}
	}
	return strings.Join(names, ",")
}

// AuditWord marks a rule as audit when it is a rule's last word.
const AuditWord = "audit"

// MaxPatternBytes bounds a rule's pattern, query included.
const MaxPatternBytes = 1024

// Rule is one parsed rule: which methods, on which paths, and whether it
// is an audit rule. The zero Rule allows every method on every path.
type Rule struct {
	// methods is 0 for any method (the rule names none).
	methods methodSet
	// path is the canonical path pattern; "" means any path, canonical or
	// not, with any query.
	path string
	// segs is path split on "/" after the leading one; nil when path is "".
	segs []string
	// fixed counts the segments of segs that are not "**", and open says
	// whether one is: a path of fewer segments than fixed (or, without
	// "**", of another number) cannot match, which is checked first.
	fixed int
	open  bool
	// query holds the pairs a request's query must consist of, sorted and
	// distinct; nil means the query is not looked at.
	query []string
	// audit rules allow, but say that the other rules would refuse.
	audit bool
}

// ParseRule parses the part of a rule line after the host name:
//
//	[METHOD[,METHOD...]] [PATTERN[?PAIR[&PAIR...]]] [audit]
//
// METHOD is one of GET HEAD POST PUT PATCH DELETE OPTIONS, in capitals.
// PATTERN starts with "/"; its segments are literal, "*" (exactly one
// non-empty segment) or "**" (any number of segments, none included);
// literal segments must be written in the canonical form of Normalize. A
// query after "?" lists the pairs (name=value, or a bare name) that a
// request's query must consist of, in any order and nothing else. An empty
// s is the rule that allows everything.
func ParseRule(s string) (Rule, error) {
	f := strings.Fields(s)
	var r Rule
	if n := len(f); n > 0 && f[n-1] == AuditWord {
		r.audit = true
		f = f[:n-1]
	}
	if len(f) > 0 && !strings.HasPrefix(f[0], "/") {
		m, err := parseMethods(f[0])
		if err != nil {
			return Rule{}, err
		}
		r.methods = m
		f = f[1:]
	}
	if len(f) > 0 {
		if !strings.HasPrefix(f[0], "/") {
			return Rule{}, fmt.Errorf("%q: a path pattern starts with /", f[0])
		}
		if err := r.parsePattern(f[0]); err != nil {
			return Rule{}, err
		}
		f = f[1:]
	}
	if len(f) > 0 {
		if f[0] == AuditWord {
			return Rule{}, fmt.Errorf("%q: audit is a rule's last word", s)
		}
		return Rule{}, fmt.Errorf("%q: unexpected %q; a rule is [METHOD[,METHOD...]] [PATTERN] [audit]", s, f[0])
	}
	return r, nil
}

// MustParseRule is ParseRule for rules written in code; it panics on error.
func MustParseRule(s string) Rule {
	r, err := ParseRule(s)
	if err != nil {
		panic(err)
	}
	return r
}

func parseMethods(s string) (methodSet, error) {
	var set methodSet
	for _, m := range strings.Split(s, ",") {
		if m == "" {
			return 0, fmt.Errorf("%q: an empty method in the list", s)
		}
		bit := methodBit(m)
		if bit == 0 {
			if methodBit(strings.ToUpper(m)) != 0 {
				return 0, fmt.Errorf("%q: methods are case-sensitive; write %s", m, strings.ToUpper(m))
			}
			return 0, fmt.Errorf("%q is not a method a rule may name (%s) nor a path pattern (starting with /)", m, strings.Join(knownMethods[:], ", "))
		}
		if set&bit != 0 {
			return 0, fmt.Errorf("%q: %s twice", s, m)
		}
		set |= bit
	}
	return set, nil
}

func (r *Rule) parsePattern(p string) error {
	if len(p) > MaxPatternBytes {
		return fmt.Errorf("pattern longer than %d bytes", MaxPatternBytes)
	}
	path, query, hasQuery := strings.Cut(p, "?")
	if strings.Contains(path, "#") {
		return fmt.Errorf("%q: a pattern has no fragment", p)
	}
	segs := strings.Split(path[1:], "/")
	for i, s := range segs {
		switch {
		case s == "*" || s == "**":
			if s == "**" && i > 0 && segs[i-1] == "**" {
				return fmt.Errorf("%q: ** twice in a row; one matches any number of segments", p)
			}
		case strings.Contains(s, "*"):
			return fmt.Errorf("%q: * and ** stand for whole segments (/a/*/b), not parts of one", p)
		case s == "" && i < len(segs)-1:
			return fmt.Errorf("%q: an empty segment; the canonical path has none", p)
		}
	}
	// Literal segments must read as Normalize writes them, so the pattern
	// means what it shows; "*" is a sub-delim and survives Normalize.
	c, err := Normalize(path)
	if err != nil {
		return fmt.Errorf("pattern %w", err)
	}
	if c != path {
		return fmt.Errorf("%q is not a canonical path; write it as %q", path, c)
	}
	if strings.Contains(path, "%2F") {
		return fmt.Errorf("%q: an encoded slash in a pattern; a segment holding one matches only **", p)
	}
	r.path, r.segs = path, segs
	for _, sg := range segs {
		if sg == "**" {
			r.open = true
		} else {
			r.fixed++
		}
	}
	if !hasQuery {
		return nil
	}
	if query == "" {
		return fmt.Errorf("%q: nothing after ?; leave the ? out to ignore the query", p)
	}
	cq, err := NormalizeQuery(query)
	if err != nil {
		return fmt.Errorf("pattern query %w", err)
	}
	if cq != query {
		return fmt.Errorf("%q is not a canonical query; write it as %q", query, cq)
	}
	pairs := strings.Split(query, "&")
	slices.Sort(pairs)
	for i, pr := range pairs {
		if pr == "" {
			return fmt.Errorf("%q: an empty pair in the query", p)
		}
		if i > 0 && pairs[i-1] == pr {
			return fmt.Errorf("%q: the pair %q twice", p, pr)
		}
	}
	r.query = pairs
	return nil
}

// String renders the rule as ParseRule reads it; "" for the zero Rule.
func (r Rule) String() string {
	var f []string
	if r.methods != 0 {
		f = append(f, r.methods.String())
	}
	if r.path != "" {
		f = append(f, r.Pattern())
	}
	if r.audit {
		f = append(f, AuditWord)
	}
	return strings.Join(f, " ")
}

// Pattern is the rule's path pattern with its query, "" when the rule
// matches any path.
func (r Rule) Pattern() string {
	if r.query == nil {
		return r.path
	}
	return r.path + "?" + strings.Join(r.query, "&")
}

// Methods lists the methods the rule names, nil for any method.
func (r Rule) Methods() []string {
	if r.methods == 0 {
		return nil
	}
	return strings.Split(r.methods.String(), ",")
}

// Audit reports whether the rule is an audit rule.
func (r Rule) Audit() bool { return r.audit }

// WithAudit returns the rule with its audit mark set to a.
func (r Rule) WithAudit(a bool) Rule {
	r.audit = a
	return r
}

// Equal reports whether r and o are the same rule.
func (r Rule) Equal(o Rule) bool {
	return r.methods == o.methods && r.path == o.path && r.audit == o.audit &&
		slices.Equal(r.query, o.query) && (r.query == nil) == (o.query == nil)
}

func (r Rule) allowsMethod(m string) bool {
	return r.allowsBit(methodBit(m))
}

// allowsBit is allowsMethod for a method's bit (methodBit), found once per
// request rather than once per rule.
func (r *Rule) allowsBit(b methodSet) bool {
	return r.methods == 0 || r.methods&b != 0
}

// Matches reports whether r allows method on t, audit or not. A rule with
// a pattern matches only a target whose path is canonical, and with a
// query only a target whose query is canonical.
func (r Rule) Matches(method string, t Target) bool {
	return r.allowsMethod(method) && r.matchesTarget(&t)
}

func (r *Rule) matchesTarget(t *Target) bool {
	if r.path == "" {
		return true
	}
	if t.PathErr != nil || len(t.split) < r.fixed || !r.open && len(t.split) != r.fixed || !matchSegments(r.segs, t.split) {
		return false
	}
	if r.query == nil {
		return true
	}
	if !t.queryOK {
		return false
	}
	var pairs []string
	if t.query != "" {
		pairs = strings.Split(t.query, "&")
	}
	if len(pairs) != len(r.query) {
		return false
	}
	pairs = slices.Clone(pairs)
	slices.Sort(pairs)
	return slices.Equal(pairs, r.query)
}

// matchSegments matches a canonical path's segments against a pattern's:
// "**" takes any number of segments, "*" one non-empty segment without an
// encoded slash, a literal only itself. A segment holding "%2F" is matched
// by "**" alone: a server that decodes it sees several segments, and only
// "**" would take those. It is the classic wildcard match with
// backtracking to the last "**", linear for one "**" and O(len(p)*len(s))
// at worst.
func matchSegments(p, s []string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		if pi < len(p) && p[pi] == "**" {
			star, mark = pi, si
			pi++
			continue
		}
		if pi < len(p) && oneSegment(p[pi], s[si]) {
			pi++
			si++
			continue
		}
		if star >= 0 {
			mark++
			pi, si = star+1, mark
			continue
		}
		return false
	}
	for pi < len(p) && p[pi] == "**" {
		pi++
	}
	return pi == len(p)
}

func oneSegment(p, s string) bool {
	if p == "*" {
		return s != "" && !strings.Contains(s, "%2F")
	}
	// A literal never holds "%2F" (ParseRule refuses it), so equality
	// alone keeps a segment with an encoded slash for "**".
	return p == s
}

// covers reports, conservatively, whether every request o allows r allows
// too: false may be wrong, true never is.
func (r Rule) covers(o Rule) bool {
	if r.methods != 0 && (o.methods == 0 || o.methods&^r.methods != 0) {
		return false
	}
	if r.path == "" {
		return true
	}
	if o.path == "" {
		return false
	}
	if r.query != nil && (o.query == nil || !slices.Equal(r.query, o.query)) {
		return false
	}
	return patternCovers(r.segs, o.segs)
}

// patternCovers reports whether every path q matches p matches too, by
// matching p's segments symbolically: p's "**" only by a "**" of q, p's
// "*" by q's "*" or "**", a literal by itself, "*" (when not empty) or
// "**". It is sound (an instance of o is an instance of r) and may miss
// containments that need several of q's segments for one of p's.
func patternCovers(q, p []string) bool {
	memo := make(map[[2]int]bool)
	var rec func(i, j int) bool
	rec = func(i, j int) bool {
		if v, ok := memo[[2]int{i, j}]; ok {
			return v
		}
		var v bool
		switch {
		case i == len(q):
			v = j == len(p)
		case q[i] == "**":
			v = rec(i+1, j) || j < len(p) && rec(i, j+1)
		case j == len(p):
			v = false
		case p[j] == "**":
			v = false
		case q[i] == "*":
			v = p[j] != "" && rec(i+1, j+1)
		default:
			v = p[j] == q[i] && rec(i+1, j+1)
		}
		memo[[2]int{i, j}] = v
		return v
	}
	return rec(0, 0)
}
