package propose

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
)

// TestProposalAllowsTheRecordAndNoOtherMethod: for random records, the
// applied proposal loads, allows every recorded request a rule can name
// (with any query), and names no method on an entry that the record did
// not show for it: collapsing widens paths, never methods.
func TestProposalAllowsTheRecordAndNoOtherMethod(t *testing.T) {
	rng := rand.New(rand.NewPCG(18, 18))
	segs := []string{"a", "b", "c", "d", "repo", "v1", "x.git", "%40s", "", "e%2Ff", "~u"}
	ms := []string{"GET", "GET", "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"}
	domains := []string{"example.com", "example.org", "github.io", "co.uk"}
	for iter := range 400 {
		var hosts []policy.LearnHost
		seen := map[string]bool{}
		for range 1 + rng.IntN(7) {
			d := domains[rng.IntN(len(domains))]
			name := fmt.Sprintf("h%d.%s", rng.IntN(6), d)
			if rng.IntN(4) == 0 {
				name = fmt.Sprintf("w%d.h%d.%s", rng.IntN(3), rng.IntN(6), d)
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			h := policy.LearnHost{Host: name}
			for range 1 + rng.IntN(14) {
				var b strings.Builder
				for range 1 + rng.IntN(5) {
					b.WriteString("/" + segs[rng.IntN(len(segs))])
				}
				m := ms[rng.IntN(len(ms))]
				h.Requests = append(h.Requests, policy.LearnRequest{Method: m, Path: b.String(), Count: 1, Write: policy.IsWrite(m)})
			}
			hosts = append(hosts, h)
		}
		cur := ""
		if iter%3 == 0 {
			cur = "h1.example.com GET /**\n*.example.org HEAD /a\n"
		}
		p := Propose(policy.LearnSnapshot{Hosts: hosts}, list(t, cur), Options{})
		checkAllows(t, p, hosts, cur)
		methodsSeen := map[string][]string{} // entry -> methods
		for _, h := range hosts {
			next, _ := allowlist.Parse(strings.NewReader(p.Apply(cur)), "applied")
			d := next.MatchNormalized(h.Host)
			for _, q := range h.Requests {
				methodsSeen[d.Rule] = append(methodsSeen[d.Rule], q.Method)
			}
		}
		for _, ln := range p.Lines {
			l, err := allowlist.ParseLine(ln.Text)
			if err != nil || l.Rule == nil {
				continue
			}
			for _, m := range l.Rule.Methods() {
				if !slices.Contains(methodsSeen[ln.Entry], m) {
					t.Fatalf("line %q names %s, which no recorded request to %s used", ln.Text, m, ln.Entry)
				}
			}
			if len(l.Rule.Methods()) == 0 || l.Rule.Pattern() == "" {
				t.Fatalf("line %q has no methods or no pattern: it would allow more than any request showed", ln.Text)
			}
		}
		if t.Failed() {
			t.Fatalf("iteration %d: record %+v\nproposal:\n%s", iter, hosts, p.Text())
		}
	}
}
