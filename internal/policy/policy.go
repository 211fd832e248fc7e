// Package policy holds one instance's filtering state shared by the DNS and
// HTTP filters: the live allowlist, the mode (active, passive, learn), the
// passive profile and the learning record, with hot reload from the
// allowlist file.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/netclass"
)

// HealthcheckName answers locally in both filters, in every mode.
const HealthcheckName = "healthcheck.abox.local"

// Reason codes beyond those of package allowlist. Every filter uses these
// strings verbatim in logs, API responses, DNS Extended Errors and 403 bodies.
const (
	ReasonHealthcheck = "healthcheck"
	// ReasonPassive: not allowlisted, allowed because the instance is in passive mode.
	ReasonPassive = "passive_mode"
	// ReasonLearn: not allowlisted, allowed because the instance is in
	// learn mode, which records what the guest does to propose rules.
	ReasonLearn = "learn_mode"
	// ReasonPrivateReverse: a reverse-mapping name (in-addr.arpa, ip6.arpa)
	// that is not a complete public address: a private or reserved range,
	// or a zone cut above one. Blocked in every mode.
	ReasonPrivateReverse = "private_reverse"
	// ReasonForbiddenAddress is what a guest is told when a name it may
	// use resolves somewhere it may not reach (a private or reserved range,
	// loopback, a metadata address, an alias of a local name): one reason
	// for every such case, so that a refusal does not tell the guest that
	// the name exists internally or what it points at (passive mode and
	// wildcards let it probe names). The filters' logs keep the precise
	// reason (dns_rebinding with the class, private, metadata, ...).
	ReasonForbiddenAddress = "forbidden_address"
)

// Mode is the enforcement mode of an instance's filters.
type Mode string

const (
	Active  Mode = "active"
	Passive Mode = "passive"
	// Learn allows names that are not allowlisted, as Passive does, but
	// keeps every other refusal of Active: IP literals (a proposal can
	// only list names), special-use and private reverse names, and the
	// filters' address checks. Request rules are recorded, not enforced
	// (EnforcesRules), and every request is recorded for a proposal.
	Learn Mode = "learn"
)

// ParseMode validates a user-supplied mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(strings.TrimSpace(s))); m {
	case Active, Passive, Learn:
		return m, nil
	}
	return "", fmt.Errorf("unknown filter mode %q: use active, passive or learn", s)
}

// EnforcesRules reports whether the proxy refuses what a host's request
// rules refuse in mode m. Only active mode does: learn mode records what
// the workload does so that rules can be proposed from it, and passive
// mode refuses no name, so rules on a name would refuse nothing a guest
// could not reach another way.
func (m Mode) EnforcesRules() bool { return m == Active }

// allowsUnlisted reports whether names that are not allowlisted are
// allowed in mode m.
func (m Mode) allowsUnlisted() bool { return m == Passive || m == Learn }

// Config configures an Engine.
type Config struct {
	// AllowlistPath is the allowlist file; it is created empty if missing.
	AllowlistPath string
	// Logger receives reload results; nil discards.
	Logger *slog.Logger
	// ProfileLimit bounds the passive profile (distinct names); 0 means 10000.
	ProfileLimit int
	// LearnLimits bound the learning record; zero fields take the defaults
	// of LearnLimits.
	LearnLimits LearnLimits
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Check, when set, refuses a list the filters could not enforce as
	// written (request rules on a host the proxy tunnels): on load, on
	// reload and on every edit, so such a list never comes into force.
	Check func(*allowlist.List) error
	// OnChange, when set, is called after each change of the list or the
	// mode in force (the audit stream's policy records), with the
	// engine's lock held: it must not call back into the engine.
	OnChange func(Change)
}

// Engine is the shared, concurrency-safe policy of one instance. Decide is
// lock-free; changes to the list are serialised by mu.
type Engine struct {
	path  string
	log   *slog.Logger
	now   func() time.Time
	check func(*allowlist.List) error // nil: none
	// onChange is Config.OnChange; nil: none.
	onChange func(Change)

	// list is never nil after New.
	list atomic.Pointer[allowlist.List]
	// mode holds a Mode; never empty after New.
	mode    atomic.Pointer[Mode]
	profile *Profile
	// learned is the learning record, fed only in learn mode.
	learned *LearnRecord

	// mu serialises reloads and file edits so an API edit never races a
	// file-watch reload into an older list.
	mu     sync.Mutex
	status atomic.Pointer[ReloadStatus]
	// unsaved is the change in force that could not be written to the
	// file; nil when the file holds the list in force. Guarded by mu.
	unsaved *unsavedChange
	// writeFile writes the allowlist file atomically; tests replace it.
	writeFile func(path string, data []byte, perm fs.FileMode) error
}

// ReloadStatus describes the last reload attempt.
type ReloadStatus struct {
	Path     string    `json:"path"`
	Entries  int       `json:"entries"`
	LoadedAt time.Time `json:"loaded_at"`
	// LastError is the error of the last rejected reload since the list in
	// force was loaded; empty when the last attempt succeeded.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	Reloads     uint64    `json:"reloads"`
	// Unsaved is set while the list in force holds a change (allowlist
	// add or remove) that could not be written to the file, with the
	// write's error; the change is enforced, but lost on a restart.
	Unsaved   string    `json:"unsaved,omitempty"`
	UnsavedAt time.Time `json:"unsaved_at,omitzero"`
}

// New loads the allowlist and returns an engine in active mode. An invalid
// file is an error: a filter must not start with a list it cannot enforce.
func New(cfg Config) (*Engine, error) {
	if cfg.AllowlistPath == "" {
		return nil, errors.New("creating policy: no allowlist path")
	}
	e := &Engine{
		path:      cfg.AllowlistPath,
		log:       cfg.Logger,
		now:       cfg.Now,
		check:     cfg.Check,
		onChange:  cfg.OnChange,
		profile:   NewProfile(cfg.ProfileLimit),
		learned:   NewLearnRecord(cfg.LearnLimits),
		writeFile: fsutil.WriteFileAtomic,
	}
	active := Active
	e.mode.Store(&active)
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	if _, err := os.Stat(e.path); errors.Is(err, fs.ErrNotExist) {
		if err := fsutil.WriteFileAtomic(e.path, []byte(emptyHeader), 0o644); err != nil {
			return nil, fmt.Errorf("creating allowlist: %w", err)
		}
	}
	l, err := e.load()
	if err != nil {
		return nil, err
	}
	e.list.Store(l)
	e.status.Store(&ReloadStatus{Path: e.path, Entries: l.Len(), LoadedAt: e.now()})
	return e, nil
}

const emptyHeader = "# abox allowlist: one name per line; *.example.com allows every name below example.com;\n# NAME [METHOD[,METHOD...]] [PATTERN] [audit] is a rule for a name, and its lines add up (docs/policy.md)\n"

func (e *Engine) load() (*allowlist.List, error) {
	f, err := os.Open(e.path)
	if err != nil {
		return nil, fmt.Errorf("loading allowlist: %w", err)
	}
	defer f.Close()
	l, err := allowlist.Parse(f, e.path)
	if err == nil {
		err = e.checkList(l)
	}
	if err != nil {
		return nil, fmt.Errorf("loading allowlist: %w", err)
	}
	return l, nil
}

// checkList applies Config.Check, naming the file.
func (e *Engine) checkList(l *allowlist.List) error {
	if e.check == nil {
		return nil
	}
	if err := e.check(l); err != nil {
		return fmt.Errorf("%s: %w", e.path, err)
	}
	return nil
}

// Path is the allowlist file.
func (e *Engine) Path() string { return e.path }

// List is the allowlist in force.
func (e *Engine) List() *allowlist.List { return e.list.Load() }

// Mode is the current mode.
func (e *Engine) Mode() Mode { return *e.mode.Load() }

// SetMode switches mode for every filter of the instance at once. A mode
// that is not one of Active, Passive and Learn is Active: nothing can be
// switched to allowing more by a typo.
func (e *Engine) SetMode(m Mode) {
	switch m {
	case Passive, Learn:
	default:
		m = Active
	}
	if m == Learn && e.Mode() != Learn {
		e.learned.start(e.now())
	}
	old := e.mode.Swap(&m)
	e.log.Info("filter mode set", "mode", string(m))
	if e.onChange != nil && *old != m {
		e.onChange(Change{Kind: "mode", Trigger: "mode", Old: string(*old), New: string(m)})
	}
}

// Decide applies the policy to a host name: healthcheck first, then the
// allowlist; in passive mode names that are not allowlisted are allowed and
// recorded. Names that are not valid host names are blocked in every mode.
// Address checks (private ranges, rebinding) are the filters' next step.
func (e *Engine) Decide(name string) allowlist.Decision {
	n, err := allowlist.NormalizeName(name)
	if err != nil {
		return allowlist.Decision{Verdict: allowlist.Block, Reason: allowlist.ReasonInvalidName}
	}
	return e.DecideNormalized(n)
}

// DecideNormalized is Decide for a name returned by allowlist.NormalizeName.
func (e *Engine) DecideNormalized(n string) allowlist.Decision {
	l := e.list.Load()
	switch m := e.Mode(); m {
	case Passive:
		// The passive profile records the names passive mode allowed, listed
		// or not; names refused in every mode are not the guest's profile.
		d := Evaluate(l, Passive, n)
		if d.Verdict == allowlist.Allow && d.Reason != ReasonHealthcheck {
			e.profile.Record(n, d.Reason != ReasonPassive, e.now())
		}
		return d
	case Learn:
		d := Evaluate(l, Learn, n)
		if d.Verdict == allowlist.Allow && d.Reason != ReasonHealthcheck {
			e.learned.name(n)
		}
		return d
	}
	return Evaluate(l, Active, n)
}

// Evaluate is the name decision of both filters as a pure function of the
// list and the mode, recording nothing: healthcheck, then numeric, special-use
// and private reverse names (blocked in every mode), then the allowlist, then
// passive and learn mode's allow. n
// must come from allowlist.NormalizeName. abox explain uses it to answer
// without touching the passive profile.
func Evaluate(l *allowlist.List, m Mode, n string) allowlist.Decision {
	if n == HealthcheckName {
		return allowlist.Decision{Verdict: allowlist.Allow, Reason: ReasonHealthcheck}
	}
	if allowlist.NumericName(n) {
		return allowlist.Decision{Verdict: allowlist.Block, Reason: allowlist.ReasonInvalidName}
	}
	if allowlist.SpecialUse(n) {
		// No upstream can answer it honestly, and the host's own resolver
		// (mDNS, systemd-resolved, the LAN's router) would answer for the
		// host's network.
		return allowlist.Decision{Verdict: allowlist.Block, Reason: allowlist.ReasonSpecialUse}
	}
	if netclass.IsReverseName(n) && !netclass.ReversePublic(n, nil) {
		// The same holds for the reverse names of private ranges, whether
		// the DNS filter is asked (PTR) or the proxy would look them up.
		return allowlist.Decision{Verdict: allowlist.Block, Reason: ReasonPrivateReverse}
	}
	d := l.MatchNormalized(n) // a nil list allows nothing
	if m.allowsUnlisted() && d.Verdict == allowlist.Block {
		if m == Learn {
			return allowlist.Decision{Verdict: allowlist.Allow, Reason: ReasonLearn}
		}
		return allowlist.Decision{Verdict: allowlist.Allow, Reason: ReasonPassive}
	}
	return d
}

// Status reports the last reload.
func (e *Engine) Status() ReloadStatus { return *e.status.Load() }

// Reload re-reads the allowlist file. On error the list in force stays and the
// error is kept in Status until a later reload succeeds.
func (e *Engine) Reload() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reloadLocked("reload")
}

func (e *Engine) reloadLocked(trigger string) error {
	prev := e.status.Load()
	if err := e.resaveLocked(); err != nil {
		return err
	}
	l, err := e.load()
	if err != nil {
		st := *prev
		st.LastError = err.Error()
		st.LastErrorAt = e.now()
		e.status.Store(&st)
		e.log.Error("allowlist reload rejected; previous list stays in force", "trigger", trigger, "path", e.path, "error", err.Error())
		return err
	}
	old := e.list.Swap(l)
	e.changed(trigger, old, l)
	e.status.Store(&ReloadStatus{Path: e.path, Entries: l.Len(), LoadedAt: e.now(), Reloads: prev.Reloads + 1})
	e.log.Info("allowlist reloaded", "trigger", trigger, "path", e.path, "entries", l.Len())
	return nil
}

// Add validates allowlist lines ("example.com", "api.github.com GET,HEAD
// /**") and appends those not yet present to the file, then reloads. A
// rule line adds a rule to its name's; a name cannot be both with and
// without rules (*RulesConflictError). Nothing is written if any line is
// invalid or conflicts. It returns the lines that were added (normalised).
func (e *Engine) Add(raw ...string) ([]string, error) {
	lines, err := parseEntries(raw)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	data, cur, err := e.baseLocked()
	if err != nil {
		return nil, fmt.Errorf("adding to allowlist: %w", err)
	}
	var added []string
	// ruled is, for each name listed or added, whether it has rules.
	ruled := map[string]bool{}
	for _, en := range cur.Entries() {
		ruled[en.String()] = cur.Rules(en.String()) != nil
	}
	seen := map[string]bool{}
	for _, ln := range lines {
		key, s := ln.Entry.String(), ln.String()
		if r, listed := ruled[key]; ln.Push == nil && listed && r != (ln.Rule != nil) {
			return nil, &RulesConflictError{Entry: key, Rules: cur.Rules(key).String(), Line: s, Listed: cur.Contains(ln.Entry)}
		}
		if ln.Push == nil {
			// A push line goes with a name listed with rules or without.
			ruled[key] = ln.Rule != nil
		}
		if seen[s] || hasLine(cur, ln) {
			continue
		}
		seen[s] = true
		added = append(added, s)
	}
	if len(added) == 0 {
		return nil, nil
	}
	return added, e.applyLocked("add", insertLines(data, added))
}

// insertLines adds lines to an allowlist text: a rule of a name already in
// the text right after that name's last line, so a name's rules read
// together, anything else at the end, in the order given.
func insertLines(data []byte, lines []string) []byte {
	text := strings.SplitAfter(string(data), "\n")
	if n := len(text); text[n-1] == "" {
		text = text[:n-1]
	}
	if n := len(text); n > 0 && !strings.HasSuffix(text[n-1], "\n") {
		text[n-1] += "\n"
	}
	last := map[string]int{}
	for i, t := range text {
		if ln, err := allowlist.ParseLine(stripComment(t)); err == nil {
			last[ln.Entry.String()] = i
		}
	}
	after := map[int][]string{}
	var tail []string
	for _, s := range lines {
		ln, _ := allowlist.ParseLine(s)
		if i, ok := last[ln.Entry.String()]; ok {
			after[i] = append(after[i], s)
		} else {
			tail = append(tail, s)
		}
	}
	var b bytes.Buffer
	for i, t := range text {
		b.WriteString(t)
		for _, s := range after[i] {
			b.WriteString(s + "\n")
		}
	}
	for _, s := range tail {
		b.WriteString(s + "\n")
	}
	return b.Bytes()
}

func stripComment(s string) string {
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// RulesConflictError is an added line that would list a name both with
// and without rules: without rules a name allows everything on it, so its
// rules would not count.
type RulesConflictError struct {
	// Entry is the name; Line the line that was refused.
	Entry, Line string
	// Rules are the name's rules in force ("" when it has none, or when
	// the conflict is between the lines of one Add).
	Rules string
	// Listed: the conflict is with the list in force, not within the
	// lines given.
	Listed bool
}

func (e *RulesConflictError) Error() string {
	switch {
	case !e.Listed:
		return fmt.Sprintf("adding %q: %s is given both with and without rules; without rules it allows everything on it, so the rules would not count: give one or the other", e.Line, e.Entry)
	case e.Rules != "":
		return fmt.Sprintf("adding %q: %s is listed with rules (%s), and a line without rules would allow everything on it, so the rules would not count: to allow everything, remove the name first (which removes its rules), then add it", e.Line, e.Entry, e.Rules)
	}
	return fmt.Sprintf("adding %q: %s is listed without rules, which allows everything on it, so the rule would not count: to restrict it to rules, remove the name first, then add its rules", e.Line, e.Entry)
}

// hasLine reports whether l holds ln: the entry for a line without rules,
// the same rule of the entry for a rule line.
func hasLine(l *allowlist.List, ln allowlist.Line) bool {
	if !l.Contains(ln.Entry) {
		return false
	}
	if ln.Push != nil {
		return slices.ContainsFunc(l.Push(ln.Entry.String()).Rules(), ln.Push.Equal)
	}
	if ln.Rule == nil {
		return l.Rules(ln.Entry.String()) == nil
	}
	return slices.ContainsFunc(l.Rules(ln.Entry.String()).Rules(), ln.Rule.Equal)
}

// Remove deletes lines and reloads: a name alone removes every line of
// that name, its rules too; a rule line ("api.github.com POST /x")
// removes just that rule, and a name whose last rule goes is no longer
// listed (it does not fall back to allowing everything). Asking to remove
// what is not in the list is an error and changes nothing. It returns the
// lines given, normalised, sorted.
func (e *Engine) Remove(raw ...string) ([]string, error) {
	lines, err := parseEntries(raw)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	data, cur, err := e.baseLocked()
	if err != nil {
		return nil, fmt.Errorf("removing from allowlist: %w", err)
	}
	// names are removed whole; rules one by one, by the line's text.
	names, rules := map[string]bool{}, map[string]bool{}
	var missing []string
	for _, ln := range lines {
		switch {
		case ln.Bare() && cur.Contains(ln.Entry):
			names[ln.Entry.String()] = true
		case !ln.Bare() && hasLine(cur, ln):
			rules[ln.String()] = true
		default:
			missing = append(missing, ln.String())
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("removing from allowlist: not listed: %s (see abox allowlist list; a rule is removed by its whole line, the name alone removes all its rules)", strings.Join(missing, ", "))
	}
	var out bytes.Buffer
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if body := stripComment(line); body != "" {
			if ln, err := allowlist.ParseLine(body); err == nil && (names[ln.Entry.String()] || rules[ln.String()]) {
				continue
			}
		}
		out.WriteString(line)
	}
	removed := slices.Sorted(maps.Keys(names))
	removed = append(removed, slices.Sorted(maps.Keys(rules))...)
	sort.Strings(removed)
	return removed, e.applyLocked("remove", out.Bytes())
}

func (e *Engine) writeLocked(data []byte) error {
	perm := fs.FileMode(0o644)
	if st, err := os.Stat(e.path); err == nil {
		perm = st.Mode().Perm()
	}
	return e.writeFile(e.path, data, perm)
}

// parseEntries parses allowlist lines given one per string.
func parseEntries(raw []string) ([]allowlist.Line, error) {
	if len(raw) == 0 {
		return nil, errors.New("no entries given")
	}
	var errs []string
	out := make([]allowlist.Line, 0, len(raw))
	for _, r := range raw {
		if strings.ContainsAny(r, "#\n\r") {
			// A comment or a second line would be written to the file as
			// given, or cut from what was checked.
			errs = append(errs, fmt.Sprintf("%q: one line, without # comments", r))
			continue
		}
		ln, err := allowlist.ParseLine(r)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		out = append(out, ln)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid allowlist entry: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// Profile returns the names recorded in passive mode.
func (e *Engine) Profile() ProfileSnapshot { return e.profile.Snapshot() }

// ClearProfile forgets the recorded names.
func (e *Engine) ClearProfile() { e.profile.Clear() }
