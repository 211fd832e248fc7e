package policy

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
)

var testNow = time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC)

// TestLearnModeDecides: learn mode allows a public name that is not
// listed, with its own reason, and refuses what active mode refuses for
// reasons other than the list: special-use, numeric (IP-literal-shaped)
// and private reverse names, invalid names.
func TestLearnModeDecides(t *testing.T) {
	e := newEngine(t, "example.com\n")
	e.SetMode(Learn)
	tests := []struct {
		name    string
		verdict allowlist.Verdict
		reason  string
	}{
		{"other.com", allowlist.Allow, ReasonLearn},
		{"example.com", allowlist.Allow, allowlist.ReasonAllowlisted},
		{"healthcheck.abox.local", allowlist.Allow, ReasonHealthcheck},
		{"printer.local", allowlist.Block, allowlist.ReasonSpecialUse},
		{"metadata.google.internal", allowlist.Block, allowlist.ReasonSpecialUse},
		{"localhost", allowlist.Block, allowlist.ReasonSpecialUse},
		{"10.0.0.5", allowlist.Block, allowlist.ReasonInvalidName},
		{"169.254.169.254", allowlist.Block, allowlist.ReasonInvalidName},
		{"5.0.0.10.in-addr.arpa", allowlist.Block, ReasonPrivateReverse},
		{"bad name", allowlist.Block, allowlist.ReasonInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := e.Decide(tt.name); d.Verdict != tt.verdict || d.Reason != tt.reason {
				t.Errorf("Decide(%q) in learn = %+v, want %s/%s", tt.name, d, tt.verdict, tt.reason)
			}
			// Evaluate answers the same without an engine (explain, revocation).
			if n, err := allowlist.NormalizeName(tt.name); err == nil {
				if d := Evaluate(e.List(), Learn, n); d.Verdict != tt.verdict || d.Reason != tt.reason {
					t.Errorf("Evaluate(%q, learn) = %+v, want %s/%s", tt.name, d, tt.verdict, tt.reason)
				}
			}
		})
	}
	names := e.Learned().Names
	if names["other.com"] != 1 || names["example.com"] != 1 {
		t.Errorf("learned names = %v, want other.com and example.com once", names)
	}
	for _, n := range []string{"printer.local", "localhost", "healthcheck.abox.local", "10.0.0.5"} {
		if _, ok := names[n]; ok {
			t.Errorf("learn recorded %q, which it refused or answered locally", n)
		}
	}
	if len(e.Profile().Entries) != 0 {
		t.Errorf("learn mode fed the passive profile: %+v", e.Profile().Entries)
	}
}

func TestModeEnforcesRules(t *testing.T) {
	for m, want := range map[Mode]bool{Active: true, Passive: false, Learn: false} {
		if got := m.EnforcesRules(); got != want {
			t.Errorf("%s.EnforcesRules() = %v, want %v", m, got, want)
		}
	}
}

func TestSetModeUnknownIsActive(t *testing.T) {
	e := newEngine(t, "")
	e.SetMode(Learn)
	e.SetMode(Mode("lern"))
	if m := e.Mode(); m != Active {
		t.Errorf("mode after SetMode(lern) = %s, want active", m)
	}
}

// TestObserveRecordsOnlyInLearnMode: the proxy calls Observe for every
// decision; only learn mode keeps anything.
func TestObserveRecordsOnlyInLearnMode(t *testing.T) {
	e := newEngine(t, "")
	get := Observation{Kind: "inner", Host: "a.example", Port: 443, Method: "GET", Path: "/x", Status: 200, Allowed: true, Reason: ReasonLearn}
	for _, m := range []Mode{Active, Passive} {
		e.SetMode(m)
		e.Observe(get)
		if s := e.Learned(); len(s.Hosts) != 0 {
			t.Fatalf("%s mode recorded %+v", m, s.Hosts)
		}
	}
	e.SetMode(Learn)
	e.Observe(get)
	e.Observe(get)
	post := get
	post.Method, post.Path, post.Status = "POST", "/upload", 201
	e.Observe(post)
	e.Observe(Observation{Kind: "connect", Host: "a.example", Port: 443, Method: "CONNECT", Allowed: true})
	e.Observe(Observation{Kind: "connect", Host: "t.example", Port: 443, Method: "CONNECT", Allowed: true, Tunnel: true})
	e.Observe(Observation{Kind: "http", Host: "10.0.0.5", Port: 80, Method: "GET", Path: "/", Status: 403, Reason: allowlist.ReasonNotAllowlisted})
	e.Observe(Observation{Kind: "http", Host: "private.example", Port: 80, Method: "GET", Path: "/", Status: 403, Reason: "private"})
	e.Observe(Observation{Kind: "http", Host: HealthcheckName, Port: 80, Method: "GET", Path: "/", Status: 200, Allowed: true})
	s := e.Learned()
	if len(s.Hosts) != 2 || s.Hosts[0].Host != "a.example" || s.Hosts[1].Host != "t.example" {
		t.Fatalf("hosts = %+v, want a.example and t.example", s.Hosts)
	}
	a := s.Hosts[0]
	var got []string
	for _, q := range a.Requests {
		got = append(got, fmt.Sprintf("%s %s %d x%d write=%v", q.Method, q.Path, q.Status, q.Count, q.Write))
	}
	want := []string{"POST /upload 201 x1 write=true", "GET /x 200 x2 write=false"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests of a.example = %q, want %q", got, want)
	}
	if a.Connects != 1 || a.Tunnel || !reflect.DeepEqual(a.Ports, []uint16{443}) {
		t.Errorf("a.example = %+v, want one intercepted CONNECT on 443", a)
	}
	if !s.Hosts[1].Tunnel {
		t.Errorf("t.example not marked tunnelled: %+v", s.Hosts[1])
	}
	if want := map[string]uint64{allowlist.ReasonNotAllowlisted: 1, "private": 1}; !reflect.DeepEqual(s.Refused, want) {
		t.Errorf("refused = %v, want %v", s.Refused, want)
	}
	e.ClearLearned()
	if s := e.Learned(); len(s.Hosts) != 0 || len(s.Refused) != 0 {
		t.Errorf("after clear: %+v", s)
	}
}

// TestLearnRecordIsBounded: a guest that floods hosts and paths fills
// the bounds and is then only counted, with the methods it used.
func TestLearnRecordIsBounded(t *testing.T) {
	r := NewLearnRecord(LearnLimits{Hosts: 3, Requests: 5, PerHost: 3, Names: 2})
	obs := func(host, method, path string) {
		r.observe(Observation{Kind: "inner", Host: host, Port: 443, Method: method, Path: path, Status: 200, Allowed: true}, testNow)
	}
	for i := range 10 {
		obs("flood.example", "GET", fmt.Sprintf("/p/%d", i))
	}
	obs("flood.example", "PUT", "/up")
	obs("flood.example", "GET", "/p/0") // held already: counted
	obs("b.example", "GET", "/1")
	obs("b.example", "GET", "/2")
	obs("b.example", "GET", "/3") // the sixth distinct request: past Requests
	obs("c.example", "GET", "/")  // a third host, with nothing held
	obs("d.example", "GET", "/")  // past Hosts
	obs("e.example", "GET", "/")
	for i := range 5 {
		r.name(fmt.Sprintf("n%d.example", i))
	}
	s := r.Snapshot()
	byHost := map[string]LearnHost{}
	for _, h := range s.Hosts {
		byHost[h.Host] = h
	}
	f := byHost["flood.example"]
	if len(f.Requests) != 3 || f.Dropped != 8 || !reflect.DeepEqual(f.DroppedMethods, []string{"GET", "PUT"}) {
		t.Errorf("flood.example: %d held, %d dropped (%v); want 3, 8, [GET PUT]", len(f.Requests), f.Dropped, f.DroppedMethods)
	}
	if f.Requests[0].Path != "/p/0" || f.Requests[0].Count != 2 {
		t.Errorf("a held request is not counted further: %+v", f.Requests[0])
	}
	if b := byHost["b.example"]; len(b.Requests) != 2 || b.Dropped != 1 {
		t.Errorf("b.example: %+v, want 2 held and 1 dropped (Requests bound)", b)
	}
	if len(s.Hosts) != 3 || s.DroppedHosts != 2 {
		t.Errorf("hosts %d, dropped %d; want 3 and 2", len(s.Hosts), s.DroppedHosts)
	}
	if len(s.Names) != 2 || s.DroppedNames != 3 {
		t.Errorf("names %v, dropped %d; want 2 and 3", s.Names, s.DroppedNames)
	}
}

func TestLearnRecordCutsMethods(t *testing.T) {
	r := NewLearnRecord(LearnLimits{})
	long := "XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX"
	r.observe(Observation{Kind: "http", Host: "a.example", Method: long, Path: "/", Allowed: true}, testNow)
	q := r.Snapshot().Hosts[0].Requests[0]
	if len(q.Method) > maxMethodBytes+len("…") || !q.Write {
		t.Errorf("method kept as %q (write %v), want cut to %d bytes and a write", q.Method, q.Write, maxMethodBytes)
	}
}
