package allowlist

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/abox-dev/abox/internal/gitpush"
	"github.com/abox-dev/abox/internal/reqrules"
)

// MaxRulesPerName bounds the rules of one entry: the proxy tries each for
// every request to the host.
const MaxRulesPerName = 1000

// Line is one allowlist line: a name and, optionally, one request rule
// for it ("NAME [METHOD[,METHOD...]] [PATTERN] [audit]", see
// reqrules.ParseRule) or one push rule ("NAME push PATTERN [delete]
// [no-create]", see gitpush.ParseRule).
type Line struct {
	Entry Entry
	// Rule is nil for a line that names the host alone, which allows
	// everything on it, and for a push line.
	Rule *reqrules.Rule
	// Push is the push rule of a push line, nil on any other; Rule and
	// Push are never both set. A push line does not list its name: it
	// holds the git pushes to a name that another line lists, with
	// request rules or without, to its push rules.
	Push *gitpush.Rule
}

// String renders the line in file syntax.
func (l Line) String() string {
	switch {
	case l.Push != nil:
		return l.Entry.String() + " " + gitpush.Word + " " + l.Push.String()
	case l.Rule == nil:
		return l.Entry.String()
	}
	return l.Entry.String() + " " + l.Rule.String()
}

// Bare reports whether l names its host alone: no request rule, no push
// rule.
func (l Line) Bare() bool { return l.Rule == nil && l.Push == nil }

// ParseLine parses one line without its comment: a name as ParseEntry
// reads it, then the rule, if any, as reqrules.ParseRule reads it.
func ParseLine(s string) (Line, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return Line{}, errors.New("empty entry")
	}
	// "exa mple.com", "a.example.com b.example.com": the second word is
	// no rule's, so say what the line is for before what is wrong with it.
	twoNames := len(f) > 1 && strings.Contains(f[1], ".") && !strings.HasPrefix(f[1], "/")
	e, err := ParseEntry(f[0])
	if err != nil {
		if twoNames {
			return Line{}, fmt.Errorf("%q: one name per line, without spaces", s)
		}
		return Line{}, err
	}
	if len(f) == 1 {
		return Line{Entry: e}, nil
	}
	if f[1] == gitpush.Word {
		pr, err := gitpush.ParseRule(strings.Join(f[2:], " "))
		if err != nil {
			return Line{}, fmt.Errorf("%s: %w", e, err)
		}
		return Line{Entry: e, Push: &pr}, nil
	}
	r, err := reqrules.ParseRule(strings.Join(f[1:], " "))
	if err != nil {
		if twoNames {
			return Line{}, fmt.Errorf("%q: one name per line, without spaces; a rule is [METHOD[,METHOD...]] [PATTERN] [audit]", s)
		}
		return Line{}, fmt.Errorf("%s: %w", e, err)
	}
	return Line{Entry: e, Rule: &r}, nil
}

// builder adds lines up into a List, refusing a name listed both with and
// without request rules.
type builder struct {
	l *List
	// line is the first line of each entry, by Entry.String().
	line map[string]int
	// bare is the first line without rules of each entry that has one.
	bare map[string]int
	// rules gathers each entry's rules; an entry without any is absent.
	rules map[string][]reqrules.Rule
	// push gathers each entry's push rules, as rules does, and pushLine
	// is the first push line of each.
	push     map[string][]gitpush.Rule
	pushLine map[string]int
}

func newBuilder(n int) *builder {
	return &builder{l: newList(n), line: make(map[string]int, n), bare: map[string]int{}, rules: map[string][]reqrules.Rule{}, push: map[string][]gitpush.Rule{}, pushLine: map[string]int{}}
}

func (b *builder) add(ln Line) error {
	key := ln.Entry.String()
	_, seen := b.line[key]
	first, bare := b.bare[key]
	_, ruled := b.rules[key]
	where := func(n int) string {
		if n == 0 {
			return "elsewhere in the list"
		}
		return fmt.Sprintf("on line %d", n)
	}
	switch {
	case ln.Bare() && ruled:
		return fmt.Errorf("%s is listed with rules %s; a line without rules allows everything on it, so the rules would not count: drop this line or the rules", key, where(b.line[key]))
	case ln.Rule != nil && bare:
		return fmt.Errorf("%s is listed without rules %s, which allows everything on it, so this rule would not count: drop that line or the rules", key, where(first))
	case ln.Rule != nil && len(b.rules[key]) >= MaxRulesPerName:
		return fmt.Errorf("%s: more than %d rules", key, MaxRulesPerName)
	case ln.Push != nil && len(b.push[key]) >= MaxRulesPerName:
		return fmt.Errorf("%s: more than %d push rules", key, MaxRulesPerName)
	}
	if ln.Push != nil {
		if _, ok := b.pushLine[key]; !ok {
			b.pushLine[key] = ln.Entry.Line
		}
		b.push[key] = append(b.push[key], *ln.Push)
		return nil
	}
	if !seen {
		b.line[key] = ln.Entry.Line
		b.l.add(ln.Entry)
	}
	switch {
	case ln.Rule != nil:
		b.rules[key] = append(b.rules[key], *ln.Rule)
	case !bare:
		b.bare[key] = ln.Entry.Line
	}
	return nil
}

// unlisted refuses push rules for a name no other line lists: a push line
// holds pushes to a host, it does not let the guest reach it. Each error
// comes with the name's first push line (0 for lines of an API call), in
// line order.
func (b *builder) unlisted() []numbered {
	var out []numbered
	for key, n := range b.pushLine {
		if _, listed := b.line[key]; !listed {
			out = append(out, numbered{n, key, fmt.Errorf("%s has push rules but no line lists it: a push rule holds pushes to a listed host; add the line %s (everything on it) or its request rules", key, key)})
		}
	}
	slices.SortFunc(out, func(a, b numbered) int { return cmp.Or(cmp.Compare(a.line, b.line), cmp.Compare(a.key, b.key)) })
	return out
}

type numbered struct {
	line int
	key  string
	err  error
}

func (b *builder) list() *List {
	if len(b.rules) > 0 {
		b.l.rules = make(map[string]*reqrules.Set, len(b.rules))
		for k, rs := range b.rules {
			b.l.rules[k] = reqrules.NewSet(k, rs)
		}
	}
	if len(b.push) > 0 {
		b.l.push = make(map[string]*gitpush.Set, len(b.push))
		for k, rs := range b.push {
			b.l.push[k] = gitpush.NewSet(k, rs)
		}
	}
	return b.l
}

// NewLines builds a list from lines already parsed with ParseLine (an
// abox.yaml's entries, an API call's), as Parse would from a file holding
// them: the lines of one name add up, and a name listed both with and
// without rules is an error.
func NewLines(lines []Line) (*List, error) {
	b := newBuilder(len(lines))
	var errs []error
	for _, ln := range lines {
		if err := b.add(ln); err != nil {
			errs = append(errs, err)
		}
	}
	for _, u := range b.unlisted() {
		errs = append(errs, u.err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return b.list(), nil
}

// Rules returns the rule set of the entry whose text is entry, as in
// Decision.Rule: nil when the entry has no rules, or is not in the list,
// and a nil *reqrules.Set allows everything. The proxy asks it after the
// name decision allowed a host.
func (l *List) Rules(entry string) *reqrules.Set {
	if l == nil {
		return nil
	}
	return l.rules[entry]
}

// Push returns the push rules of the entry whose text is entry, as Rules
// does: nil when it has none, and a nil *gitpush.Set holds no push.
func (l *List) Push(entry string) *gitpush.Set {
	if l == nil {
		return nil
	}
	return l.push[entry]
}

// Restricted lists the entries that carry request or push rules, in
// source order. A host the proxy tunnels unseen (--no-mitm, an exception)
// cannot have its rules enforced; the caller refuses such a list.
func (l *List) Restricted() []Entry {
	if l == nil || len(l.rules) == 0 && len(l.push) == 0 {
		return nil
	}
	var out []Entry
	for _, e := range l.entries {
		if l.rules[e.String()] != nil || l.push[e.String()] != nil {
			out = append(out, e)
		}
	}
	return out
}

// Lines returns the list as lines, in source order: an entry without rules
// as one line, an entry with rules as one line per rule, then a line per
// push rule.
func (l *List) Lines() []Line {
	if l == nil {
		return nil
	}
	out := make([]Line, 0, len(l.entries))
	for _, e := range l.entries {
		set, push := l.rules[e.String()], l.push[e.String()]
		if set == nil {
			out = append(out, Line{Entry: e})
		}
		for _, r := range set.Rules() {
			out = append(out, Line{Entry: e, Rule: &r})
		}
		for _, r := range push.Rules() {
			out = append(out, Line{Entry: e, Push: &r})
		}
	}
	return out
}

// Text renders the list as Parse reads it, lines in source order.
func (l *List) Text() string {
	var b strings.Builder
	for _, ln := range l.Lines() {
		b.WriteString(ln.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// Change is one way a list allows more than another.
type Change struct {
	// Entry is the entry of the new list that allows more.
	Entry string `json:"entry"`
	Why   string `json:"why"`
}

// Widenings lists how next allows more than prev: a name prev does not
// allow, or rules that allow a request prev's rules for the name refuse
// (audit rules count as allowing; a name that loses all its rules allows
// everything). A list that only narrows gives none. It is conservative:
// when it cannot tell (reqrules.Set.Covers), it reports a widening.
//
// It compares the entries that decide each name, not entries by text: an
// exact name added with rules below a wildcard that allowed more narrows
// that name, and an exact entry dropped under a wildcard with wider rules
// widens it.
func Widenings(prev, next *List) []Change {
	var out []Change
	seen := map[string]bool{}
	check := func(e Entry) {
		probe := e.Name
		if e.Wildcard {
			// A label no entry names: the probe is decided by e itself in
			// the list that has it, and by what is above it otherwise.
			probe = wildcardProbe + "." + e.Name
		}
		if seen[probe] {
			return
		}
		seen[probe] = true
		dn := next.MatchNormalized(probe)
		if dn.Verdict != Allow {
			return
		}
		name := e.String()
		if e.Wildcard {
			name = "names below " + e.Name
		}
		dp := prev.MatchNormalized(probe)
		if dp.Verdict != Allow {
			out = append(out, Change{Entry: dn.Rule, Why: fmt.Sprintf("lets the guest reach %s%s", name, rulesNote(next.Rules(dn.Rule)))})
			return
		}
		if pp, np := prev.Push(dp.Rule), next.Push(dn.Rule); !pp.Covers(np) {
			now := "every push"
			if np != nil {
				now = "push " + np.String()
			}
			out = append(out, Change{Entry: dn.Rule, Why: fmt.Sprintf("allows more pushes to %s: %s (was push %s)", name, now, pp)})
		}
		ps, ns := prev.Rules(dp.Rule), next.Rules(dn.Rule)
		if ps.Covers(ns) {
			return
		}
		was := "rules " + ps.String()
		if dp.Rule != dn.Rule {
			was = dp.Rule + "'s rules " + ps.String()
		}
		now := "everything"
		if ns != nil {
			now = ns.String()
		}
		out = append(out, Change{Entry: dn.Rule, Why: fmt.Sprintf("allows more on %s: %s (was %s)", name, now, was)})
	}
	for _, e := range next.Entries() {
		check(e)
	}
	for _, e := range prev.Entries() {
		check(e)
	}
	return out
}

func rulesNote(s *reqrules.Set) string {
	if s == nil {
		return ""
	}
	return " (rules " + s.String() + ")"
}
