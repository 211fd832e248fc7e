package gitpush

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Word is the allowlist word that starts a push rule: "NAME push PATTERN".
const Word = "push"

// Flag words after a rule's pattern.
const (
	// FlagDelete lets the rule's refs be deleted.
	FlagDelete = "delete"
	// FlagNoCreate keeps the rule to refs that exist: no new ones.
	FlagNoCreate = "no-create"
)

// Reason codes of a refused push. Stable: they are in the proxy's answer,
// its decision log and the denial id's line.
const (
	// ReasonRefNotAllowed: no push rule of the host names the ref.
	ReasonRefNotAllowed = "push_ref_not_allowed"
	// ReasonDeleteNotAllowed: the rules name the ref, none with delete.
	ReasonDeleteNotAllowed = "push_delete_not_allowed"
	// ReasonCreateNotAllowed: the rules name the ref, all with no-create.
	ReasonCreateNotAllowed = "push_create_not_allowed"
	// ReasonWithRefused: the ref is allowed, but another ref of the same
	// push is not, and a push is decided whole.
	ReasonWithRefused = "push_refused_whole"
	// ReasonUnreadable: the command section is malformed or too long.
	ReasonUnreadable = "push_unreadable"
	// ReasonUnjudgeable: a well-formed request no rule can judge (push
	// options, a signed push, an unknown capability).
	ReasonUnjudgeable = "push_unjudgeable"
	// ReasonEncoding: the body is compressed; git never compresses a push.
	ReasonEncoding = "push_encoding_refused"
)

// Rule is one push rule: refs matching Pattern may be updated, created
// unless NoCreate, deleted if Delete. Whether an update is a fast-forward
// cannot be told from the commands (the proxy sees no history), so a rule
// allows forced updates of its refs too.
type Rule struct {
	// Pattern is a full ref name whose components are literals, * (one
	// component) or ** (any number of components, none included).
	Pattern  string
	Delete   bool
	NoCreate bool
	split    []string
}

// ParseRule parses the words after "push": "PATTERN [delete] [no-create]".
func ParseRule(s string) (Rule, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return Rule{}, errors.New("push needs a ref pattern: push refs/heads/agent/* [delete] [no-create]")
	}
	pat := f[0]
	if !strings.HasPrefix(pat, "refs/") {
		if !strings.Contains(pat, "/") && pat != "*" && pat != "**" {
			return Rule{}, fmt.Errorf("push pattern %q is not a full ref name: write refs/heads/%s (a branch) or refs/tags/%s (a tag)", pat, pat, pat)
		}
		return Rule{}, fmt.Errorf("push pattern %q does not start with refs/: write refs/heads/... for branches, refs/tags/... for tags", pat)
	}
	r := Rule{Pattern: pat, split: strings.Split(pat, "/")}
	for _, c := range r.split {
		if c == "*" || c == "**" {
			continue
		}
		if strings.Contains(c, "*") {
			return Rule{}, fmt.Errorf("push pattern %q: * and ** stand for whole components (refs/heads/agent/*), not part of one", pat)
		}
		if err := checkComponent(c); err != nil {
			return Rule{}, fmt.Errorf("push pattern %q: %w", pat, err)
		}
	}
	if len(pat) > MaxRefLen {
		return Rule{}, fmt.Errorf("push pattern longer than %d bytes", MaxRefLen)
	}
	for _, w := range f[1:] {
		switch {
		case w == FlagDelete && !r.Delete:
			r.Delete = true
		case w == FlagNoCreate && !r.NoCreate:
			r.NoCreate = true
		case w == FlagDelete || w == FlagNoCreate:
			return Rule{}, fmt.Errorf("push rule: %s twice", w)
		default:
			return Rule{}, fmt.Errorf("push rule: unknown word %q after the pattern; the words are %s and %s (one pattern per line)", w, FlagDelete, FlagNoCreate)
		}
	}
	return r, nil
}

// String renders the rule as ParseRule reads it.
func (r Rule) String() string {
	s := r.Pattern
	if r.Delete {
		s += " " + FlagDelete
	}
	if r.NoCreate {
		s += " " + FlagNoCreate
	}
	return s
}

// Equal reports whether r and o are the same rule.
func (r Rule) Equal(o Rule) bool { return r.String() == o.String() }

// Matches reports whether ref is one of r's refs.
func (r Rule) Matches(ref string) bool {
	return match(r.split, strings.Split(ref, "/"))
}

func match(pat, comps []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			for i := 0; i <= len(comps); i++ {
				if match(pat[1:], comps[i:]) {
					return true
				}
			}
			return false
		}
		if len(comps) == 0 || pat[0] != "*" && pat[0] != comps[0] {
			return false
		}
		pat, comps = pat[1:], comps[1:]
	}
	return len(comps) == 0
}

// allows says whether r allows c, and if not, why.
func (r Rule) allows(k Kind) (bool, string) {
	switch {
	case k == Delete && !r.Delete:
		return false, ReasonDeleteNotAllowed
	case k == Create && r.NoCreate:
		return false, ReasonCreateNotAllowed
	}
	return true, ""
}

// Set is the push rules of one host, added up: a ref update is allowed
// when one rule allows it. A nil *Set holds no push (a host without push
// rules). Immutable, safe for concurrent use.
type Set struct {
	name  string
	rules []Rule
}

// NewSet makes the set of the entry name.
func NewSet(name string, rules []Rule) *Set {
	return &Set{name: name, rules: slices.Clone(rules)}
}

// Name is the entry the rules belong to.
func (s *Set) Name() string { return s.name }

// Rules returns the rules in source order.
func (s *Set) Rules() []Rule {
	if s == nil {
		return nil
	}
	return slices.Clone(s.rules)
}

// String lists the rules, "; "-separated.
func (s *Set) String() string {
	var b []string
	for _, r := range s.Rules() {
		b = append(b, r.String())
	}
	return strings.Join(b, "; ")
}

// Covers reports whether s allows every ref update o allows, judged rule
// by rule (conservative: each of o's rules must be one of s's). A nil set
// holds no push, allowing every one: it covers every set, and is covered
// by none but nil.
func (s *Set) Covers(o *Set) bool {
	if s == nil {
		return true
	}
	if o == nil {
		return false
	}
	for _, r := range o.rules {
		if !slices.ContainsFunc(s.rules, r.Equal) {
			return false
		}
	}
	return true
}

// Verdict is the decision on one command.
type Verdict struct {
	Command Command
	Allowed bool
	// Reason is a refusal's reason code; empty when allowed.
	Reason string
	// Rule is the rule that allowed it, as written.
	Rule string
}

// Decision is the outcome for a whole push: allowed only if every command
// is, since a push is decided whole (a partly refused push would leave
// the refs it names in a state the agent did not ask for).
type Decision struct {
	Allowed bool
	// Reason is the first refused command's reason code.
	Reason string
	// Set names the entry whose rules decided.
	Set      string
	Verdicts []Verdict
}

// Check decides every command of req.
func (s *Set) Check(req *Request) Decision {
	d := Decision{Allowed: true, Set: s.name}
	for _, c := range req.Commands {
		v := Verdict{Command: c, Reason: ReasonRefNotAllowed}
		for _, r := range s.rules {
			if !r.Matches(c.Ref) {
				continue
			}
			ok, why := r.allows(c.Kind())
			if ok {
				v.Allowed, v.Reason, v.Rule = true, "", r.String()
				break
			}
			if v.Reason == ReasonRefNotAllowed {
				v.Reason = why
			}
		}
		if !v.Allowed && d.Allowed {
			d.Allowed, d.Reason = false, v.Reason
		}
		d.Verdicts = append(d.Verdicts, v)
	}
	if !d.Allowed {
		for i := range d.Verdicts {
			if d.Verdicts[i].Allowed {
				d.Verdicts[i].Allowed, d.Verdicts[i].Reason = false, ReasonWithRefused
			}
		}
	}
	return d
}

// Summary lists the refs and their verdicts, for a log line:
// "refs/heads/main push_ref_not_allowed, refs/heads/agent/x push_refused_whole".
func (d Decision) Summary() string {
	var b []string
	for _, v := range d.Verdicts {
		w := string(v.Command.Kind())
		if !v.Allowed {
			w = v.Reason
		}
		b = append(b, v.Command.Ref+" "+w)
	}
	return strings.Join(b, ", ")
}
