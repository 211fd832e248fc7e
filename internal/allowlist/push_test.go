package allowlist

import (
	"strings"
	"testing"
)

const pushList = `
code.example.com
code.example.com push refs/heads/agent/*
code.example.com push refs/heads/scratch/** delete
git.example.org GET /**
git.example.org POST /acme/app.git/git-receive-pack
git.example.org push refs/heads/agent/*
plain.example.net
plain.example.net push refs/heads/agent/* no-create
`

func TestParsePushLines(t *testing.T) {
	l := mustParse(t, pushList)
	cases := []struct {
		entry, rules string
		ruled        bool
	}{
		{"code.example.com", "refs/heads/agent/*; refs/heads/scratch/** delete", false},
		{"git.example.org", "refs/heads/agent/*", true},
		{"plain.example.net", "refs/heads/agent/* no-create", false},
	}
	for _, c := range cases {
		if got := l.Push(c.entry).String(); got != c.rules {
			t.Errorf("push rules of %s: %q, want %q", c.entry, got, c.rules)
		}
		if got := l.Rules(c.entry) != nil; got != c.ruled {
			t.Errorf("%s has request rules: %v, want %v", c.entry, got, c.ruled)
		}
	}
	var restricted []string
	for _, e := range l.Restricted() {
		restricted = append(restricted, e.String())
	}
	if got := strings.Join(restricted, " "); got != "code.example.com git.example.org plain.example.net" {
		t.Errorf("Restricted = %s: a host with push rules must be intercepted", got)
	}
	// The text round-trips, and a line re-parses to itself (abox.yaml and
	// the API carry lines as text).
	l2 := mustParse(t, l.Text())
	if l2.Text() != l.Text() {
		t.Errorf("round trip:\n%s\nbecame\n%s", l.Text(), l2.Text())
	}
	for _, ln := range l.Lines() {
		got, err := ParseLine(ln.String())
		if err != nil || got.String() != ln.String() {
			t.Errorf("%q re-parses to %q, %v", ln.String(), got.String(), err)
		}
	}
	if _, err := NewLines(l.Lines()); err != nil {
		t.Errorf("NewLines of its own lines: %v", err)
	}
}

func TestParsePushLinesRejects(t *testing.T) {
	cases := []struct{ text, want string }{
		{"code.example.com push", "allowlist:1: code.example.com: push needs a ref pattern"},
		{"code.example.com push main", "allowlist:1: code.example.com: push pattern \"main\" is not a full ref name: write refs/heads/main"},
		{"code.example.com push refs/heads/agent-*", "whole components"},
		{"code.example.com push refs/heads/a tags", "unknown word \"tags\""},
		{"ok.example.com\ncode.example.com push refs/heads/a..b", "allowlist:2: code.example.com: push pattern"},
		// A push line does not list its host: the guest reaching it is
		// another line's say.
		{"ok.example.com\ncode.example.com push refs/heads/agent/*", "allowlist:2: code.example.com has push rules but no line lists it: a push rule holds pushes to a listed host; add the line code.example.com"},
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) {
			_, err := Parse(strings.NewReader(c.text), "allowlist")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want one holding %q", err, c.want)
			}
		})
	}
}

func TestPushWidenings(t *testing.T) {
	cases := []struct {
		name, prev, next string
		widens           bool
	}{
		{"same", "c.example.com\nc.example.com push refs/heads/agent/*", "c.example.com\nc.example.com push refs/heads/agent/*", false},
		{"drops the push rules", "c.example.com\nc.example.com push refs/heads/agent/*", "c.example.com", true},
		{"another ref", "c.example.com\nc.example.com push refs/heads/agent/*", "c.example.com\nc.example.com push refs/heads/main", true},
		{"adds delete", "c.example.com\nc.example.com push refs/heads/agent/*", "c.example.com\nc.example.com push refs/heads/agent/* delete", true},
		{"drops one of two", "c.example.com\nc.example.com push refs/heads/agent/*\nc.example.com push refs/heads/main", "c.example.com\nc.example.com push refs/heads/agent/*", false},
		{"holds pushes where none were", "c.example.com", "c.example.com\nc.example.com push refs/heads/agent/*", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Widenings(mustParse(t, c.prev), mustParse(t, c.next))
			if (len(got) > 0) != c.widens {
				t.Errorf("widenings %v, want widening %v", got, c.widens)
			}
		})
	}
}

func TestNewLinesRefusesUnlistedPush(t *testing.T) {
	ln, err := ParseLine("code.example.com push refs/heads/agent/*")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewLines([]Line{ln}); err == nil || !strings.Contains(err.Error(), "no line lists it") {
		t.Errorf("NewLines of a push line alone: %v, want the host unlisted", err)
	}
}
