// Package allowlist parses, normalises and matches the per-instance domain allowlist
// shared by the DNS and HTTP filters, and holds each entry's request rules.
package allowlist

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"

	"github.com/abox-dev/abox/internal/gitpush"
	"github.com/abox-dev/abox/internal/reqrules"
)

// Verdict is the outcome of a policy decision.
type Verdict string

const (
	Allow Verdict = "allow"
	Block Verdict = "block"
)

// Reason codes produced by matching. They are stable: they appear in logs, API
// responses, DNS Extended Errors and the proxy's 403 responses.
const (
	ReasonAllowlisted    = "allowlisted"
	ReasonNotAllowlisted = "not_allowlisted"
	ReasonInvalidName    = "invalid_name"
)

// Decision is the result of matching one name. Rule is the allowlist entry that
// matched, empty when none did.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	Reason  string  `json:"reason"`
	Rule    string  `json:"rule,omitempty"`
}

// Entry is one normalised allowlist line.
type Entry struct {
	// Name is the normalised base name (lowercase ASCII, no trailing dot).
	Name string
	// Wildcard means "any name strictly below Name", never Name itself.
	Wildcard bool
	// Line is the 1-based source line, 0 when the entry came from an API call.
	Line int
}

// String renders the entry in file syntax.
func (e Entry) String() string {
	if e.Wildcard {
		return "*." + e.Name
	}
	return e.Name
}

// List is an immutable, parsed allowlist. The zero value allows nothing.
type List struct {
	// exact and wild map a normalised name to the rule text that allows it.
	// Both are read-only after construction, so a List is safe for concurrent use.
	exact map[string]string
	wild  map[string]string
	// entries keeps file order for listing; duplicates are dropped.
	entries []Entry
	// rules maps an entry's text to its request rules; an entry without
	// rules is absent (everything on the host). Read-only, nil when no
	// entry has rules.
	rules map[string]*reqrules.Set
	// push maps an entry's text to its push rules, as rules does; an
	// entry without any is absent (pushes are not held).
	push map[string]*gitpush.Set
}

// LineError is one rejected line.
type LineError struct {
	Source string
	Line   int
	Text   string
	Err    error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("%s:%d: %v", e.Source, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// ParseError lists every invalid line of a rejected allowlist.
type ParseError struct {
	Lines []*LineError
}

func (e *ParseError) Error() string {
	msgs := make([]string, 0, len(e.Lines))
	for _, l := range e.Lines {
		msgs = append(msgs, l.Error())
	}
	return strings.Join(msgs, "; ")
}

// maxLineErrors bounds the size of a ParseError for a hostile or garbage file.
const maxLineErrors = 20

// maxLineBytes bounds one line; a DNS name is at most 253 bytes plus "*."
// and a comment, a rule's pattern reqrules.MaxPatternBytes.
const maxLineBytes = 4096

// Parse reads an allowlist: one line per name, or per rule of a name
// (ParseLine), the lines of one name adding up. source names the input in
// errors (usually the file path). If any line is invalid the whole list is
// rejected with a *ParseError.
func Parse(r io.Reader, source string) (*List, error) {
	b := newBuilder(0)
	var perr ParseError
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1024), maxLineBytes)
	n := 0
	for sc.Scan() {
		n++
		text := stripComment(sc.Text())
		if text == "" {
			continue
		}
		ln, err := ParseLine(text)
		if err == nil {
			ln.Entry.Line = n
			err = b.add(ln)
		}
		if err != nil {
			if len(perr.Lines) < maxLineErrors {
				perr.Lines = append(perr.Lines, &LineError{Source: source, Line: n, Text: text, Err: err})
			}
			continue
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			perr.Lines = append(perr.Lines, &LineError{Source: source, Line: n + 1, Err: fmt.Errorf("line longer than %d bytes", maxLineBytes)})
		} else {
			return nil, fmt.Errorf("reading %s: %w", source, err)
		}
	}
	for _, u := range b.unlisted() {
		if len(perr.Lines) < maxLineErrors {
			perr.Lines = append(perr.Lines, &LineError{Source: source, Line: u.line, Err: u.err})
		}
	}
	if len(perr.Lines) > 0 {
		return nil, &perr
	}
	return b.list(), nil
}

// New builds a list without rules from entries already parsed with
// ParseEntry; NewLines builds one with rules.
func New(entries []Entry) *List {
	l := newList(len(entries))
	for _, e := range entries {
		l.add(e)
	}
	return l
}

func newList(n int) *List {
	return &List{exact: make(map[string]string, n), wild: make(map[string]string)}
}

func (l *List) add(e Entry) {
	m := l.exact
	if e.Wildcard {
		m = l.wild
	}
	if _, dup := m[e.Name]; dup {
		return
	}
	m[e.Name] = e.String()
	l.entries = append(l.entries, e)
}

// Entries returns the entries in source order.
func (l *List) Entries() []Entry {
	if l == nil {
		return nil
	}
	out := make([]Entry, len(l.entries))
	copy(out, l.entries)
	return out
}

// Len is the number of distinct entries.
func (l *List) Len() int {
	if l == nil {
		return 0
	}
	return len(l.entries)
}

// Contains reports whether the exact entry (same name and wildcard flag) is present.
func (l *List) Contains(e Entry) bool {
	if l == nil {
		return false
	}
	m := l.exact
	if e.Wildcard {
		m = l.wild
	}
	_, ok := m[e.Name]
	return ok
}

// Match decides whether name is allowed. name may be in any case and carry a
// trailing dot; anything that does not normalise to a valid hostname is blocked.
func (l *List) Match(name string) Decision {
	n, err := NormalizeName(name)
	if err != nil {
		return Decision{Verdict: Block, Reason: ReasonInvalidName}
	}
	return l.MatchNormalized(n)
}

// MatchNormalized is Match for a name already returned by NormalizeName.
func (l *List) MatchNormalized(n string) Decision {
	if l == nil {
		return Decision{Verdict: Block, Reason: ReasonNotAllowlisted}
	}
	if rule, ok := l.exact[n]; ok {
		return Decision{Verdict: Allow, Reason: ReasonAllowlisted, Rule: rule}
	}
	// Walk up the labels: a.b.example.com is allowed by *.b.example.com or
	// *.example.com (or *.com, which Parse refuses).
	for i := 0; i < len(n); i++ {
		if n[i] != '.' {
			continue
		}
		if rule, ok := l.wild[n[i+1:]]; ok {
			return Decision{Verdict: Allow, Reason: ReasonAllowlisted, Rule: rule}
		}
	}
	return Decision{Verdict: Block, Reason: ReasonNotAllowlisted}
}

// ParseEntry parses and normalises one allowlist entry ("example.com" or
// "*.example.com"), refusing anything that would allow too much.
func ParseEntry(s string) (Entry, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Entry{}, errors.New("empty entry")
	}
	if strings.ContainsAny(s, " \t") {
		return Entry{}, fmt.Errorf("%q: one name per line, without spaces", s)
	}
	if s == "*" || s == "*." {
		return Entry{}, errors.New(`"*" would allow everything; list the names you need`)
	}
	wildcard := false
	base := s
	if strings.HasPrefix(s, "*.") {
		wildcard = true
		base = s[2:]
	}
	if strings.Contains(base, "*") {
		return Entry{}, fmt.Errorf("%q: a wildcard is only allowed as the whole first label, as in *.example.com", s)
	}
	if strings.Contains(base, "://") || strings.ContainsAny(base, "/:@?#") {
		return Entry{}, fmt.Errorf("%q: write a host name only, without scheme, port or path", s)
	}
	if looksLikeIP(strings.TrimSuffix(strings.Trim(base, "[]"), ".")) {
		return Entry{}, fmt.Errorf("%q: IP addresses are not allowlist entries; permit address ranges with --allow-private", s)
	}
	name, err := NormalizeName(base)
	if err != nil {
		return Entry{}, fmt.Errorf("%q: %w", s, err)
	}
	if !strings.Contains(name, ".") {
		return Entry{}, fmt.Errorf("%q: a bare top-level domain would allow too much; name a domain below it", s)
	}
	if NumericName(name) {
		// The filters read such a name as an address and never allow it
		// (invalid_name): an entry for it would only look as if it did.
		return Entry{}, fmt.Errorf("%q: its last label starts with a digit, so the filters read it as an IP address and refuse it in every mode; no top-level domain does", s)
	}
	if SpecialUse(name) {
		return Entry{}, fmt.Errorf("%q: names in local and special-use zones (.local, .localhost, .internal, .home.arpa, .lan, ...) are never forwarded upstream, so an entry cannot allow them", s)
	}
	if wildcard {
		ps, _ := publicsuffix.PublicSuffix(name)
		if ps == name {
			return Entry{}, fmt.Errorf("%q: %s is a public suffix, so the wildcard would allow unrelated owners; name a domain below it", s, name)
		}
		// A wildcard rule of the list (*.kawasaki.jp, *.compute.amazonaws.com)
		// makes every child of name a public suffix: any child will do as a
		// probe, and an exception rule (!city.kawasaki.jp) never names ours.
		probe := wildcardProbe + "." + name
		if ps, _ := publicsuffix.PublicSuffix(probe); ps == probe {
			return Entry{}, fmt.Errorf("%q: the names directly below %s are public suffixes, so the wildcard would allow unrelated owners; name a domain below one of them", s, name)
		}
		// A suffix deeper down (s3.amazonaws.com below *.amazonaws.com,
		// blob.core.windows.net below *.core.windows.net) makes the wildcard
		// cover every owner registered under it too.
		if below := suffixBelow(name); below != "" {
			ex := "*.NAME." + strings.TrimPrefix(below, "*.")
			if strings.HasPrefix(below, "*.") {
				ex = "*.NAME.LABEL." + below[2:]
			}
			return Entry{}, fmt.Errorf("%q: %s is a public suffix below %s, so the wildcard would allow names of unrelated owners; allow your own name below it instead, such as %s or an exact host name", s, below, name, ex)
		}
	}
	return Entry{Name: name, Wildcard: wildcard}, nil
}

// wildcardProbe is a label no public suffix rule names.
const wildcardProbe = "abox-wildcard-probe"

func looksLikeIP(s string) bool {
	if _, err := netip.ParseAddr(s); err == nil {
		return true
	}
	// All-numeric dotted forms (127.1, 0x7f.1, 2130706433) are IPv4 literals to
	// many resolvers and URL parsers.
	last := s
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		last = s[i+1:]
	}
	if last == "" {
		return false
	}
	for _, c := range strings.ToLower(last) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == 'x') {
			return false
		}
	}
	return last[0] >= '0' && last[0] <= '9'
}

func stripComment(s string) string {
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// idnaProfile converts Unicode names to punycode with the lookup rules that
// browsers apply, but leaves underscores alone (they are common in SRV and
// TXT owner names and are checked by validASCII instead).
var idnaProfile = idna.New(idna.MapForLookup(), idna.BidiRule(), idna.Transitional(false))

// NormalizeName returns the canonical form used for matching: lowercase ASCII
// (punycode for Unicode names), no trailing dot, valid label syntax and length.
func NormalizeName(name string) (string, error) {
	name = strings.TrimSuffix(name, ".")
	if name == "" {
		return "", errors.New("empty name")
	}
	if isASCII(name) {
		name = strings.ToLower(name)
	} else {
		a, err := idnaProfile.ToASCII(name)
		if err != nil {
			return "", fmt.Errorf("not a valid internationalised name: %w", err)
		}
		name = strings.TrimSuffix(a, ".")
	}
	if err := validASCII(name); err != nil {
		return "", err
	}
	return name, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// validASCII checks hostname syntax: letters, digits, hyphen and underscore,
// labels of 1-63 bytes, no leading or trailing hyphen, at most 253 bytes.
func validASCII(name string) error {
	if len(name) > 253 {
		return errors.New("name longer than 253 bytes")
	}
	start := 0
	for i := 0; i <= len(name); i++ {
		if i < len(name) && name[i] != '.' {
			c := name[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return fmt.Errorf("character %q is not allowed in a host name", c)
			}
			continue
		}
		label := name[start:i]
		switch {
		case label == "":
			return errors.New("empty label")
		case len(label) > 63:
			return errors.New("label longer than 63 bytes")
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Errorf("label %q starts or ends with a hyphen", label)
		}
		start = i + 1
	}
	return nil
}

// Format renders entries in file syntax, sorted and de-duplicated.
func Format(entries []Entry) string {
	seen := make(map[string]bool, len(entries))
	lines := make([]string, 0, len(entries))
	for _, e := range entries {
		s := e.String()
		if !seen[s] {
			seen[s] = true
			lines = append(lines, s)
		}
	}
	sort.Strings(lines)
	var b strings.Builder
	for _, s := range lines {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}
