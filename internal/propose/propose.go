// Package propose turns what learn mode recorded into the smallest
// allowlist lines, with request rules, that would have allowed it, and
// says which of them a human must look at.
package propose

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"golang.org/x/net/publicsuffix"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// Options tune how far paths and names are collapsed. Zero fields take
// the defaults named on each.
type Options struct {
	// Siblings is how many different segments at one place of a path
	// become "*" (/a/b/x, /a/b/y, /a/b/z: /a/b/*); 0 means 3.
	Siblings int
	// MaxPatterns is how many patterns one prefix may hold, for one
	// method, before they become PREFIX/**; 0 means 4.
	MaxPatterns int
	// WildcardHosts is how many names strictly below one registrable
	// domain become *.DOMAIN (when the Public Suffix List allows that
	// wildcard, as allowlist.ParseEntry decides); 0 means 4.
	WildcardHosts int
}

func (o Options) withDefaults() Options {
	if o.Siblings <= 0 {
		o.Siblings = 3
	}
	if o.MaxPatterns <= 0 {
		o.MaxPatterns = 4
	}
	if o.WildcardHosts <= 0 {
		o.WildcardHosts = 4
	}
	return o
}

// Line is one allowlist line to add.
type Line struct {
	// Text is the line in allowlist syntax (allowlist.ParseLine reads it).
	Text string `json:"line"`
	// Entry is the entry the line adds to or creates.
	Entry string `json:"entry"`
	// Requests counts the recorded requests this line is the first to allow.
	Requests uint64 `json:"requests"`
	// Review says why a human should look at the line before applying
	// it; empty when nothing stands out. Writes and uploads can carry the
	// guest's data out; wildcards and tunnels allow more than was seen.
	Review []string `json:"review,omitempty"`
}

// Proposal is the lines to add to the allowlist in force, in a
// deterministic order, and what a reader should know besides.
type Proposal struct {
	// Header, when set, is written as a comment before the lines (where
	// they came from); Propose leaves it empty.
	Header string `json:"-"`
	Lines  []Line `json:"lines"`
	// Notes are facts of the record no line expresses: what was not
	// proposed and why, what learn mode refused, what it could not hold.
	Notes []string `json:"notes,omitempty"`
}

// hostReqs is what one host needs: requests the list in force refuses.
type hostReqs struct {
	host   string
	entry  string // the entry lines go to
	exists bool   // entry is in the list in force (with rules)
	tunnel bool
	reqs   []policy.LearnRequest
}

// Propose builds the lines that, added to cur, allow every request rec
// holds that cur refuses and that a rule can name; everything else is a
// note. It changes nothing and depends only on its arguments.
func Propose(rec policy.LearnSnapshot, cur *allowlist.List, o Options) Proposal {
	o = o.withDefaults()
	var p Proposal
	var need []*hostReqs
	for _, h := range rec.Hosts {
		if hr := p.classify(h, cur); hr != nil {
			need = append(need, hr)
		}
	}
	need = p.wildcards(need, cur, o)
	for _, hr := range need {
		p.Lines = append(p.Lines, linesFor(hr, o, &p)...)
	}
	sort.SliceStable(p.Lines, func(i, j int) bool { return p.Lines[i].Entry < p.Lines[j].Entry })
	p.count(need)
	p.recordNotes(rec)
	return p
}

// classify decides what of h the list in force allows already and where
// the rest must go; nil when nothing is needed.
func (p *Proposal) classify(h policy.LearnHost, cur *allowlist.List) *hostReqs {
	if h.Host == policy.HealthcheckName {
		return nil
	}
	e, err := allowlist.ParseEntry(h.Host)
	if err != nil || e.Wildcard {
		p.note("%s: not proposed, it cannot be an allowlist entry: %v", h.Host, err)
		return nil
	}
	if h.Dropped > 0 {
		p.note("%s: %d requests (%s) on paths the record could not hold are not covered; clear the record (abox net learn clear) and run less, or review what the host is for", h.Host, h.Dropped, strings.Join(h.DroppedMethods, ","))
	}
	hr := &hostReqs{host: e.Name, entry: e.Name, tunnel: h.Tunnel}
	d := cur.MatchNormalized(e.Name)
	var set *reqrules.Set
	if d.Verdict == allowlist.Allow {
		set = cur.Rules(d.Rule)
		if set == nil {
			return nil // everything on it is allowed already
		}
		hr.entry, hr.exists = d.Rule, true
	}
	if h.Tunnel {
		if hr.exists {
			p.note("%s: tunnelled unseen (a MITM exception or --no-mitm), so its requests cannot be checked, but %s has rules, which the filters refuse for such a host; make it intercepted, or drop the rules", h.Host, hr.entry)
			return nil
		}
		return hr
	}
	for _, q := range h.Requests {
		if dec, _ := set.Check(q.Method, q.Path, ""); set != nil && dec.Allowed {
			continue
		}
		hr.reqs = append(hr.reqs, q)
	}
	if len(hr.reqs) == 0 {
		if len(h.Requests) == 0 && h.Connects > 0 && d.Verdict != allowlist.Allow {
			p.note("%s: connected %d times but made no request the proxy read (a TLS handshake the client gave up?); not proposed", h.Host, h.Connects)
		}
		return nil
	}
	return hr
}

// wildcards merges new hosts below one registrable domain into
// *.DOMAIN when there are at least WildcardHosts of them and the Public
// Suffix List allows the wildcard; the domain itself stays exact.
func (p *Proposal) wildcards(need []*hostReqs, cur *allowlist.List, o Options) []*hostReqs {
	groups := map[string][]*hostReqs{}
	for _, hr := range need {
		if hr.exists || hr.tunnel {
			continue
		}
		reg, err := publicsuffix.EffectiveTLDPlusOne(hr.host)
		if err != nil || reg == hr.host {
			continue
		}
		groups[reg] = append(groups[reg], hr)
	}
	merged := map[*hostReqs]bool{}
	var out []*hostReqs
	regs := make([]string, 0, len(groups))
	for reg := range groups {
		regs = append(regs, reg)
	}
	sort.Strings(regs)
	for _, reg := range regs {
		g := groups[reg]
		if len(g) < o.WildcardHosts {
			continue
		}
		w, err := allowlist.ParseEntry("*." + reg)
		if err != nil {
			p.note("names below %s: %d seen, but %v; proposed one by one", reg, len(g), err)
			continue
		}
		if d := cur.MatchNormalized("abox-wildcard-probe." + reg); d.Verdict == allowlist.Allow {
			continue // decided by an entry in force; its names went there
		}
		wr := &hostReqs{host: w.String(), entry: w.String()}
		var names []string
		for _, hr := range g {
			merged[hr] = true
			names = append(names, hr.host)
			wr.reqs = append(wr.reqs, hr.reqs...)
		}
		sort.Strings(names)
		wr.host = fmt.Sprintf("%d names below %s (%s)", len(names), reg, strings.Join(names, ", "))
		out = append(out, wr)
	}
	for _, hr := range need {
		if !merged[hr] {
			out = append(out, hr)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].entry < out[j].entry })
	return out
}

// linesFor collapses one entry's requests into rule lines.
func linesFor(hr *hostReqs, o Options, p *Proposal) []Line {
	if hr.tunnel {
		return []Line{{Text: hr.entry, Entry: hr.entry, Review: []string{
			"tunnelled unseen (a MITM exception or --no-mitm): no request could be recorded, so the entry allows everything on it, writes included"}}}
	}
	perMethod := map[string]*node{}
	type seen struct{ method, path string }
	var kept []seen // requests a line can allow, path as the line writes it
	for _, q := range hr.reqs {
		if !knownMethod(q.Method) {
			p.note("%s: %q %q not proposed: a rule can only name GET HEAD POST PUT PATCH DELETE OPTIONS, and a rule without methods would allow every method on its paths", hr.entry, q.Method, q.Path)
			continue
		}
		segs, ok := segments(q.Path)
		if !ok {
			p.note("%s: %s %q not proposed: the path has no canonical form, so only a rule with no pattern (every path) could allow it", hr.entry, q.Method, q.Path)
			continue
		}
		n := perMethod[q.Method]
		if n == nil {
			n = &node{}
			perMethod[q.Method] = n
		}
		n.insert(segs)
		// The form the line is made of: ASCII, so a comment in the file
		// holds nothing the guest chose to break it with.
		kept = append(kept, seen{q.Method, "/" + strings.Join(segs, "/")})
	}
	byPattern := map[string][]string{}
	for m, n := range perMethod {
		for _, pat := range n.patterns(o, 0) {
			s := "/" + strings.Join(pat, "/")
			byPattern[s] = append(byPattern[s], m)
		}
	}
	pats := make([]string, 0, len(byPattern))
	for s := range byPattern {
		pats = append(pats, s)
	}
	sort.Strings(pats)
	var out []Line
	for _, pat := range pats {
		ms := byPattern[pat]
		slices.SortFunc(ms, func(a, b string) int { return methodIndex(a) - methodIndex(b) })
		text := hr.entry + " " + strings.Join(ms, ",") + " " + pat
		l, err := allowlist.ParseLine(text)
		if err != nil {
			p.note("%s: %s not proposed: %v", hr.entry, text, err)
			continue
		}
		ln := Line{Text: text, Entry: hr.entry}
		for _, m := range ms {
			if !policy.IsWrite(m) {
				continue
			}
			var ex []string
			for _, k := range kept {
				if k.method == m && len(ex) < 3 && !slices.Contains(ex, k.path) && l.Rule.Matches(m, reqrules.NewTarget(k.path, "", false)) {
					ex = append(ex, k.path)
				}
			}
			sort.Strings(ex)
			ln.Review = append(ln.Review, fmt.Sprintf("%s can carry data out: the guest sent %s %s", m, m, strings.Join(ex, ", ")))
		}
		if up := uploadSegment(pat); up != "" {
			ln.Review = append(ln.Review, fmt.Sprintf("the path names an upload (%q)", up))
		}
		if strings.HasSuffix(pat, "/**") {
			ln.Review = append(ln.Review, fmt.Sprintf("more than %d paths collapsed to %s", o.MaxPatterns, pat))
		}
		if strings.HasPrefix(hr.entry, "*.") {
			if hr.exists {
				ln.Review = append(ln.Review, "adds to the rules of "+hr.entry+", which decide every name below it")
			} else {
				ln.Review = append(ln.Review, "wildcard for "+hr.host)
			}
		}
		out = append(out, ln)
	}
	return out
}

// count credits each needed request to the first line allowing it, and
// notes any that no line allows (a line refused by ParseLine, or a path
// collapsing could not express).
func (p *Proposal) count(need []*hostReqs) {
	sets := map[string][]reqrules.Rule{}
	idx := map[string][]int{}
	for i, ln := range p.Lines {
		l, err := allowlist.ParseLine(ln.Text)
		if err != nil || l.Rule == nil {
			continue
		}
		sets[ln.Entry] = append(sets[ln.Entry], *l.Rule)
		idx[ln.Entry] = append(idx[ln.Entry], i)
	}
	for _, hr := range need {
		if hr.tunnel {
			continue
		}
		for _, q := range hr.reqs {
			t := reqrules.NewTarget(q.Path, "", false)
			for k, r := range sets[hr.entry] {
				if r.Matches(q.Method, t) {
					p.Lines[idx[hr.entry][k]].Requests += q.Count
					break
				}
			}
		}
	}
}

func (p *Proposal) recordNotes(rec policy.LearnSnapshot) {
	if rec.DroppedHosts > 0 {
		p.note("%d requests to further hosts were not recorded (the record holds %d hosts)", rec.DroppedHosts, rec.Limits.Hosts)
	}
	seen := map[string]bool{}
	for _, h := range rec.Hosts {
		seen[h.Host] = true
	}
	var only []string
	for n := range rec.Names {
		if !seen[n] {
			only = append(only, n)
		}
	}
	sort.Strings(only)
	if len(only) > 0 {
		p.note("resolved but never asked of the proxy, so not proposed: %s", strings.Join(only, ", "))
	}
	if len(rec.Refused) > 0 {
		reasons := make([]string, 0, len(rec.Refused))
		for r, c := range rec.Refused {
			reasons = append(reasons, fmt.Sprintf("%s ×%d", r, c))
		}
		sort.Strings(reasons)
		p.note("learn mode refused, as active mode does: %s (abox http logs --refusals shows them)", strings.Join(reasons, ", "))
	}
}

func (p *Proposal) note(format string, args ...any) {
	p.Notes = append(p.Notes, fmt.Sprintf(format, args...))
}

// Text is the lines as they would be appended to the allowlist file, each
// line to review preceded by its reasons as comments.
func (p Proposal) Text() string {
	var b strings.Builder
	if p.Header != "" && len(p.Lines) > 0 {
		fmt.Fprintf(&b, "# %s\n", p.Header)
	}
	for _, ln := range p.Lines {
		for _, r := range ln.Review {
			fmt.Fprintf(&b, "# review: %s\n", r)
		}
		b.WriteString(ln.Text)
		b.WriteByte('\n')
	}
	return b.String()
}

// Diff renders the proposal as a unified diff that appends Text to cur,
// the text of the allowlist named path; "" when nothing would be added.
func (p Proposal) Diff(path, cur string) string {
	if len(p.Lines) == 0 {
		return ""
	}
	add := strings.Split(strings.TrimSuffix(p.Text(), "\n"), "\n")
	n := strings.Count(cur, "\n")
	if cur != "" && !strings.HasSuffix(cur, "\n") {
		n++
	}
	var b strings.Builder
	fmt.Fprintf(&b, "--- %s\n+++ %s (proposed)\n@@ -%d,0 +%d,%d @@\n", path, path, n, n+1, len(add))
	for _, l := range add {
		b.WriteString("+" + l + "\n")
	}
	return b.String()
}

// Apply returns cur with the proposal appended, as the allowlist text to
// put in force.
func (p Proposal) Apply(cur string) string {
	if len(p.Lines) == 0 {
		return cur
	}
	if cur != "" && !strings.HasSuffix(cur, "\n") {
		cur += "\n"
	}
	return cur + p.Text()
}

var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

func knownMethod(m string) bool { return slices.Contains(methods, m) }

func methodIndex(m string) int { return slices.Index(methods, m) }

// uploadWords mark a path segment as an upload: data the guest sends,
// whatever the method (a GET of an upload URL is how some APIs hand one
// out). git-upload-pack is git's fetch, and not one.
var uploadWords = []string{"upload", "receive-pack", "publish", "incoming", "attachment"}

func uploadSegment(pattern string) string {
	for _, s := range strings.Split(strings.ToLower(pattern), "/") {
		if strings.Contains(s, "upload-pack") {
			continue // git's fetch: the server uploads to the client
		}
		for _, w := range uploadWords {
			if strings.Contains(s, w) {
				return s
			}
		}
	}
	return ""
}
