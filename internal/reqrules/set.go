package reqrules

import (
	"net/url"
	"slices"
	"strings"
)

// Reason codes of a refusal by a rule set. They are stable: the proxy's
// 403, its decision log, denial ids and abox explain carry them verbatim.
const (
	// ReasonMethodNotAllowed: no rule of the set names the method.
	ReasonMethodNotAllowed = "method_not_allowed"
	// ReasonPathNotAllowed: a rule names the method, none the path (and
	// query).
	ReasonPathNotAllowed = "path_not_allowed"
	// ReasonPathNotCanonical: the path (or the query a rule looks at) has no
	// canonical form, so no rule with a pattern can allow it.
	ReasonPathNotCanonical = "path_not_canonical"
)

// Target is a request's path and query as a rule set sees them and as the
// proxy sends them upstream.
type Target struct {
	// Path is the canonical escaped path when PathErr is nil, else the
	// request's own (only a rule without a pattern allows such a request,
	// and it does not look at the path).
	Path string
	// PathErr says why the path has no canonical form; nil when it has.
	PathErr error
	// Query is the raw query to send: canonical when queryOK, else the
	// request's own.
	Query string
	// query is the canonical query, "" when none or not queryOK.
	query   string
	queryOK bool
	// segments of Path after the leading "/"; nil when PathErr != nil.
	split []string
}

// NewTarget normalises a request's escaped path (url.URL.EscapedPath or the
// request-target before "?") and raw query. The query is left as received
// unless canonicalQuery, as it is for a set with a rule on queries: a
// signed URL stays the bytes its signer signed when no rule looks at it.
func NewTarget(escapedPath, rawQuery string, canonicalQuery bool) Target {
	t := Target{Path: escapedPath, Query: rawQuery}
	if c, err := Normalize(escapedPath); err != nil {
		t.PathErr = err
	} else {
		t.Path = c
		t.split = strings.Split(c[1:], "/")
	}
	if q, err := NormalizeQuery(rawQuery); err == nil {
		t.query, t.queryOK = q, true
		if canonicalQuery {
			t.Query = q
		}
	}
	return t
}

// SetURL writes t's canonical parts into u, the URL sent upstream: Path and
// RawPath so that u.EscapedPath() is t.Path byte for byte, and RawQuery.
// It leaves alone what has no canonical form, which only a rule that does
// not look at it can have allowed.
func (t Target) SetURL(u *url.URL) {
	if t.PathErr == nil && t.split != nil {
		p, err := url.PathUnescape(t.Path)
		if err == nil {
			u.Path, u.RawPath = p, t.Path
		}
	}
	u.RawQuery = t.Query
}

// Decision is the outcome of a rule set for one request.
type Decision struct {
	// Allowed is the verdict.
	Allowed bool `json:"allowed"`
	// Reason is the refusal's reason code; empty when Allowed.
	Reason string `json:"reason,omitempty"`
	// WouldDeny is set when only an audit rule allowed the request: the
	// reason code the set's other rules refuse it with.
	WouldDeny string `json:"would_deny,omitempty"`
	// Rule is the rule that allowed the request (Rule.String); empty on a
	// refusal. With WouldDeny it is the audit rule.
	Rule string `json:"rule,omitempty"`
	// Set names the rule set that decided (the host entry's name).
	Set string `json:"set,omitempty"`
	// Detail says why a path has no canonical form.
	Detail string `json:"detail,omitempty"`
}

// Set is the rules of one host, added up: a request is allowed when one
// rule allows it. A nil *Set allows everything (a host without rules). A
// Set is immutable and safe for concurrent use.
type Set struct {
	name  string
	rules []Rule
	// texts[i] is rules[i].String(), made once: a decision names its rule.
	texts []string
	// byFirst indexes the rules whose pattern starts with a literal
	// segment by it, rest holds the others (no pattern, or "*" or "**"
	// first), each in rule order: a request is tried against its first
	// segment's rules and the rest only.
	byFirst map[string][]int
	rest    []int
	// Which methods some rule (enforced: some rule not audit) names; all
	// (allEnforced): a rule names none, so takes every method.
	named, namedEnforced methodSet
	all, allEnforced     bool
	// queryRules: some rule looks at the query, so the query is
	// canonicalised before it is matched and sent.
	queryRules bool
}

// NewSet builds the rule set named name (the host entry it belongs to,
// for decisions and logs). Equal rules are kept once; no rules gives nil,
// the set that allows everything.
func NewSet(name string, rules []Rule) *Set {
	if len(rules) == 0 {
		return nil
	}
	s := &Set{name: name}
	for _, r := range rules {
		if slices.ContainsFunc(s.rules, r.Equal) {
			continue
		}
		if r.query != nil {
			s.queryRules = true
		}
		i := len(s.rules)
		s.rules = append(s.rules, r)
		s.texts = append(s.texts, r.String())
		if r.path != "" && r.segs[0] != "*" && r.segs[0] != "**" {
			if s.byFirst == nil {
				s.byFirst = map[string][]int{}
			}
			s.byFirst[r.segs[0]] = append(s.byFirst[r.segs[0]], i)
		} else {
			s.rest = append(s.rest, i)
		}
		s.named |= r.methods
		s.all = s.all || r.methods == 0
		if !r.audit {
			s.namedEnforced |= r.methods
			s.allEnforced = s.allEnforced || r.methods == 0
		}
	}
	return s
}

// Name is the name given to NewSet.
func (s *Set) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// Rules lists the rules in the order given.
func (s *Set) Rules() []Rule {
	if s == nil {
		return nil
	}
	return slices.Clone(s.rules)
}

// String lists the rules, "; " between them, as a summary for a denial.
func (s *Set) String() string {
	if s == nil {
		return ""
	}
	f := make([]string, len(s.rules))
	for i, r := range s.rules {
		f[i] = r.String()
		if f[i] == "" {
			f[i] = "(everything)"
		}
	}
	return strings.Join(f, "; ")
}

// Check decides a request: its method, its escaped path (url.URL's
// EscapedPath, or the request-target before "?") and raw query. The
// Target is what to send upstream (see Target.SetURL). This is the one
// function the proxy and abox explain decide with. A nil Set allows
// everything and returns the path and query as given.
func (s *Set) Check(method, escapedPath, rawQuery string) (Decision, Target) {
	if s == nil {
		return Decision{Allowed: true}, Target{Path: escapedPath, Query: rawQuery}
	}
	t := NewTarget(escapedPath, rawQuery, s.queryRules)
	return s.Decide(method, t), t
}

// Decide is Check for a Target already built by NewTarget; the secrets
// bindings of a host use it to decide with the proxy's Target.
func (s *Set) Decide(method string, t Target) Decision {
	if s == nil {
		return Decision{Allowed: true}
	}
	// Audit rules allow, so the refusal of a request none allows counts
	// them; what the set "would deny" with is decided by the others.
	mb := methodBit(method)
	audit := -1 // the first audit rule that matches
	var first []int
	if t.split != nil {
		first = s.byFirst[t.split[0]]
	}
	// Both lists are in rule order: merged, the first rule that allows
	// is the first of the set's that does.
	for a, b := 0, 0; a < len(first) || b < len(s.rest); {
		var i int
		if b == len(s.rest) || a < len(first) && first[a] < s.rest[b] {
			i, a = first[a], a+1
		} else {
			i, b = s.rest[b], b+1
		}
		r := &s.rules[i]
		if !r.allowsBit(mb) || !r.matchesTarget(&t) {
			continue
		}
		if !r.audit {
			return Decision{Allowed: true, Rule: s.texts[i], Set: s.name}
		}
		if audit < 0 {
			audit = i
		}
	}
	if audit >= 0 {
		reason, detail := refusal(s.allEnforced || s.namedEnforced&mb != 0, t)
		return Decision{Allowed: true, WouldDeny: reason, Rule: s.texts[audit], Set: s.name, Detail: detail}
	}
	reason, detail := refusal(s.all || s.named&mb != 0, t)
	return Decision{Reason: reason, Set: s.name, Detail: detail}
}

// refusal is the reason code for a request no rule allows: the method
// first (no path would help), then a path without a canonical form.
func refusal(methodNamed bool, t Target) (reason, detail string) {
	switch {
	case !methodNamed:
		return ReasonMethodNotAllowed, ""
	case t.PathErr != nil:
		return ReasonPathNotCanonical, t.PathErr.Error()
	}
	return ReasonPathNotAllowed, ""
}

// Covers reports, conservatively, whether s allows every request o allows
// (audit rules count as allowing): true means o is not wider than s; false
// may also be said of an o that is not wider, never the other way. A nil
// Set allows everything.
func (s *Set) Covers(o *Set) bool {
	if s == nil {
		return true
	}
	others := []Rule{{}}
	if o != nil {
		others = o.rules
	}
	for _, r := range others {
		if !slices.ContainsFunc(s.rules, func(q Rule) bool { return q.covers(r) }) {
			return false
		}
	}
	return true
}
