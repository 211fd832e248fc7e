package propose

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/policy"
)

func host(name string, reqs ...string) policy.LearnHost {
	h := policy.LearnHost{Host: name}
	for _, r := range reqs {
		m, p, _ := strings.Cut(r, " ")
		h.Requests = append(h.Requests, policy.LearnRequest{Method: m, Path: p, Count: 1, Status: 200, Write: policy.IsWrite(m)})
	}
	return h
}

func list(t *testing.T, text string) *allowlist.List {
	t.Helper()
	l, err := allowlist.Parse(strings.NewReader(text), "allow.txt")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func texts(p Proposal) []string {
	var out []string
	for _, l := range p.Lines {
		out = append(out, l.Text)
	}
	return out
}

func TestPropose(t *testing.T) {
	tests := []struct {
		name  string
		hosts []policy.LearnHost
		cur   string
		want  []string
	}{
		{"empty record", nil, "", nil},
		{"exact paths, methods per host",
			[]policy.LearnHost{host("api.example.com", "GET /v1/items", "HEAD /v1/items", "POST /v1/items")},
			"", []string{"api.example.com GET,HEAD,POST /v1/items"}},
		{"two siblings stay exact",
			[]policy.LearnHost{host("a.example.com", "GET /a/b/x", "GET /a/b/y")},
			"", []string{"a.example.com GET /a/b/x", "a.example.com GET /a/b/y"}},
		{"three siblings become *",
			[]policy.LearnHost{host("a.example.com", "GET /a/b/x", "GET /a/b/y", "GET /a/b/z")},
			"", []string{"a.example.com GET /a/b/*"}},
		{"siblings merge their subtrees",
			[]policy.LearnHost{host("a.example.com", "GET /r/x/info", "GET /r/y/info", "GET /r/z/info", "GET /r/z/refs")},
			"", []string{"a.example.com GET /r/*/info", "a.example.com GET /r/*/refs"}},
		{"past the bound a prefix becomes **",
			[]policy.LearnHost{host("a.example.com", "GET /pkg/a/1", "GET /pkg/b/2/x", "GET /pkg/c/3/y/z", "GET /pkg/d", "GET /pkg/e/", "GET /pkg/f/g/h/i", "GET /pkg/j/k", "GET /pkg/l/m", "GET /pkg/n/o", "GET /other")},
			"", []string{"a.example.com GET /other", "a.example.com GET /pkg/*/**"}},
		{"writes are collapsed on their own",
			[]policy.LearnHost{host("a.example.com", "GET /i/1", "GET /i/2", "GET /i/3", "POST /i/2")},
			"", []string{"a.example.com GET /i/*", "a.example.com POST /i/2"}},
		{"root and trailing slash are kept",
			[]policy.LearnHost{host("a.example.com", "GET /", "GET /d/", "GET /d")},
			"", []string{"a.example.com GET /", "a.example.com GET /d", "a.example.com GET /d/"}},
		{"the path is canonicalised",
			[]policy.LearnHost{host("a.example.com", "GET /x/%61//y/./z")},
			"", []string{"a.example.com GET /x/a/y/z"}},
		{"an encoded slash is **",
			[]policy.LearnHost{host("registry.example.com", "GET /@scope%2Fname")},
			"", []string{"registry.example.com GET /**"}},
		{"a cut path ends in **",
			[]policy.LearnHost{host("a.example.com", "GET /long/abc…")},
			"", []string{"a.example.com GET /long/**"}},
		{"a bare entry allows it already",
			[]policy.LearnHost{host("a.example.com", "POST /x")},
			"a.example.com\n", nil},
		{"a bare wildcard allows it already",
			[]policy.LearnHost{host("b.a.example.com", "POST /x")},
			"*.a.example.com\n", nil},
		{"rules in force: only what they refuse, on their entry",
			[]policy.LearnHost{host("a.example.com", "GET /x", "POST /y")},
			"a.example.com GET /**\n", []string{"a.example.com POST /y"}},
		{"rules of a wildcard in force get the addition",
			[]policy.LearnHost{host("b.example.com", "PUT /up")},
			"*.example.com GET /**\n", []string{"*.example.com PUT /up"}},
		{"four names below one domain become a wildcard",
			[]policy.LearnHost{host("a.cdn.example.com", "GET /1"), host("b.cdn.example.com", "GET /1"), host("c.cdn.example.com", "GET /2"), host("d.example.com", "GET /1"), host("example.com", "GET /")},
			"", []string{"*.example.com GET /1", "*.example.com GET /2", "example.com GET /"}},
		{"three names below one domain stay exact",
			[]policy.LearnHost{host("a.example.com", "GET /"), host("b.example.com", "GET /"), host("c.example.com", "GET /")},
			"", []string{"a.example.com GET /", "b.example.com GET /", "c.example.com GET /"}},
		{"no wildcard over a public suffix",
			[]policy.LearnHost{host("a.github.io", "GET /"), host("b.github.io", "GET /"), host("c.github.io", "GET /"), host("d.github.io", "GET /")},
			"", []string{"a.github.io GET /", "b.github.io GET /", "c.github.io GET /", "d.github.io GET /"}},
		{"no wildcard over a domain with a public suffix below it",
			[]policy.LearnHost{host("a.s3.amazonaws.com", "GET /"), host("b.s3.amazonaws.com", "GET /"), host("c.s3.amazonaws.com", "GET /"), host("d.s3.amazonaws.com", "GET /")},
			"", []string{"a.s3.amazonaws.com GET /", "b.s3.amazonaws.com GET /", "c.s3.amazonaws.com GET /", "d.s3.amazonaws.com GET /"}},
		{"no wildcard where the Public Suffix List has suffixes below",
			[]policy.LearnHost{host("ec2.amazonaws.com", "GET /"), host("iam.amazonaws.com", "GET /"), host("sqs.amazonaws.com", "GET /"), host("sts.amazonaws.com", "GET /")},
			"", []string{"ec2.amazonaws.com GET /", "iam.amazonaws.com GET /", "sqs.amazonaws.com GET /", "sts.amazonaws.com GET /"}},
		{"a tunnelled host is a bare entry",
			[]policy.LearnHost{{Host: "t.example.com", Tunnel: true, Connects: 2}},
			"", []string{"t.example.com"}},
		{"unknown methods and non-canonical paths are not proposed",
			[]policy.LearnHost{host("a.example.com", "PROPFIND /x", "GET /a/..;/admin", "GET /ok")},
			"", []string{"a.example.com GET /ok"}},
		{"IP literals and special names are never entries",
			[]policy.LearnHost{host("10.0.0.5", "GET /"), host("printer.local", "GET /")},
			"", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := list(t, tt.cur)
			p := Propose(policy.LearnSnapshot{Hosts: tt.hosts}, cur, Options{})
			if got := texts(p); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("lines = %q, want %q\nnotes: %q", got, tt.want, p.Notes)
			}
			checkAllows(t, p, tt.hosts, tt.cur)
		})
	}
}

// checkAllows: the proposal, applied, loads, and allows every recorded
// request a rule can name (the oracle is the allowlist's own decision).
func checkAllows(t *testing.T, p Proposal, hosts []policy.LearnHost, cur string) {
	t.Helper()
	next, err := allowlist.Parse(strings.NewReader(p.Apply(cur)), "applied")
	if err != nil {
		t.Fatalf("the applied proposal does not load: %v\n%s", err, p.Apply(cur))
	}
	for _, h := range hosts {
		if _, err := allowlist.ParseEntry(h.Host); err != nil {
			continue
		}
		d := next.MatchNormalized(h.Host)
		if d.Verdict != allowlist.Allow {
			t.Errorf("%s not allowed by the applied proposal", h.Host)
			continue
		}
		set := next.Rules(d.Rule)
		for _, q := range h.Requests {
			if !knownMethod(q.Method) {
				continue
			}
			if _, ok := segments(q.Path); !ok {
				continue
			}
			path := q.Path
			if strings.HasSuffix(path, cutMark) {
				path = strings.TrimSuffix(path, cutMark) + "def/more"
			}
			if dec, _ := set.Check(q.Method, path, "?q=1"); !dec.Allowed {
				t.Errorf("%s %s %s refused by the applied proposal: %+v", h.Host, q.Method, q.Path, dec)
			}
		}
	}
}

func TestReview(t *testing.T) {
	hosts := []policy.LearnHost{
		host("api.example.com", "GET /v1/items", "POST /v1/items", "DELETE /v1/items/7"),
		host("up.example.org", "GET /uploads/new"),
		{Host: "t.example.net", Tunnel: true},
		host("git.example.net", "POST /o/r/git-upload-pack", "POST /o/r/git-receive-pack"),
	}
	p := Propose(policy.LearnSnapshot{Hosts: hosts}, list(t, ""), Options{})
	review := map[string]string{}
	for _, l := range p.Lines {
		review[l.Text] = strings.Join(l.Review, "; ")
	}
	for line, want := range map[string]string{
		"api.example.com GET,POST /v1/items":         "POST can carry data out",
		"api.example.com DELETE /v1/items/7":         "DELETE can carry data out",
		"up.example.org GET /uploads/new":            "upload",
		"t.example.net":                              "tunnelled unseen",
		"git.example.net POST /o/r/git-receive-pack": "names an upload",
	} {
		got, ok := review[line]
		if !ok {
			t.Errorf("no line %q in %q", line, texts(p))
			continue
		}
		if want == "" && got != "" || !strings.Contains(got, want) {
			t.Errorf("review of %q = %q, want %q", line, got, want)
		}
	}
	for _, l := range p.Lines {
		if l.Text == "git.example.net POST /o/r/git-upload-pack" && strings.Contains(strings.Join(l.Review, ";"), "names an upload") {
			t.Errorf("git's fetch flagged as an upload: %q", l.Review)
		}
	}
	if txt := p.Text(); !strings.Contains(txt, "# review: POST can carry data out: the guest sent POST /v1/items\napi.example.com GET,POST /v1/items\n") {
		t.Errorf("Text does not put the review above its line:\n%s", txt)
	}
}

// TestDeterministic: the same record in another order gives the same
// proposal, byte for byte.
func TestDeterministic(t *testing.T) {
	var hosts []policy.LearnHost
	for i := range 6 {
		var reqs []string
		for j := range 12 {
			reqs = append(reqs, fmt.Sprintf("GET /r/%d/%d", j%4, (i*j)%5), fmt.Sprintf("POST /w/%d", j%3))
		}
		hosts = append(hosts, host(fmt.Sprintf("h%d.example.com", i), reqs...))
	}
	first := Propose(policy.LearnSnapshot{Hosts: hosts}, list(t, ""), Options{})
	for range 20 {
		shuffled := append([]policy.LearnHost(nil), hosts...)
		for i := range shuffled {
			j := (i*7 + 3) % len(shuffled)
			shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
			rs := append([]policy.LearnRequest(nil), shuffled[i].Requests...)
			for a := range rs {
				b := (a*5 + 1) % len(rs)
				rs[a], rs[b] = rs[b], rs[a]
			}
			shuffled[i].Requests = rs
		}
		if got := Propose(policy.LearnSnapshot{Hosts: shuffled}, list(t, ""), Options{}); got.Text() != first.Text() || !reflect.DeepEqual(got.Notes, first.Notes) {
			t.Fatalf("proposal depends on order:\n%s\nvs\n%s", got.Text(), first.Text())
		}
	}
	checkAllows(t, first, hosts, "")
}

func TestNotes(t *testing.T) {
	rec := policy.LearnSnapshot{
		Hosts: []policy.LearnHost{
			{Host: "flood.example.com", Requests: host("x", "GET /a").Requests, Dropped: 40, DroppedMethods: []string{"GET", "PUT"}},
			{Host: "hs.example.com", Connects: 3},
		},
		Names:        map[string]uint64{"flood.example.com": 1, "dns-only.example.com": 2},
		Refused:      map[string]uint64{"not_allowlisted": 2, "private": 1},
		DroppedHosts: 5,
		Limits:       policy.LearnLimits{Hosts: 1000},
	}
	p := Propose(rec, list(t, ""), Options{})
	all := strings.Join(p.Notes, "\n")
	for _, want := range []string{
		"flood.example.com: 40 requests (GET,PUT) on paths the record could not hold are not covered",
		"hs.example.com: connected 3 times but made no request",
		"resolved but never asked of the proxy, so not proposed: dns-only.example.com",
		"not_allowlisted ×2, private ×1",
		"5 requests to further hosts were not recorded",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("notes lack %q:\n%s", want, all)
		}
	}
}

func TestDiff(t *testing.T) {
	p := Propose(policy.LearnSnapshot{Hosts: []policy.LearnHost{host("a.example.com", "GET /x", "PUT /y")}}, list(t, ""), Options{})
	cur := "# header\nold.example.com\n"
	want := "--- /i/allow.txt\n+++ /i/allow.txt (proposed)\n@@ -2,0 +3,3 @@\n+a.example.com GET /x\n+# review: PUT can carry data out: the guest sent PUT /y\n+a.example.com PUT /y\n"
	if got := p.Diff("/i/allow.txt", cur); got != want {
		t.Errorf("Diff =\n%s\nwant\n%s", got, want)
	}
	if got := (Proposal{}).Diff("/i/allow.txt", cur); got != "" {
		t.Errorf("empty proposal's diff = %q, want none", got)
	}
	if got := p.Apply("old.example.com"); !strings.HasPrefix(got, "old.example.com\na.example.com GET /x\n") {
		t.Errorf("Apply = %q", got)
	}
}
