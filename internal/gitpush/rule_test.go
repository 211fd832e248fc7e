package gitpush

import (
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{"refs/heads/agent/*", "refs/heads/agent/*", ""},
		{"refs/heads/agent/**  delete", "refs/heads/agent/** delete", ""},
		{"refs/heads/main no-create delete", "refs/heads/main delete no-create", ""},
		{"refs/tags/*", "refs/tags/*", ""},
		{"", "", "needs a ref pattern"},
		{"main", "", "write refs/heads/main"},
		{"heads/agent/*", "", "does not start with refs/"},
		{"refs/heads/agent-*", "", "whole components"},
		{"refs/heads/a..b", "", "contains .."},
		{"refs/heads/x.lock", "", ".lock"},
		{"refs/heads/a delete delete", "", "delete twice"},
		{"refs/heads/a tags", "", `unknown word "tags"`},
		{"refs/heads/a refs/heads/b", "", "one pattern per line"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			r, err := ParseRule(c.in)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one holding %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.String() != c.want {
				t.Errorf("%q, want %q", r.String(), c.want)
			}
			if r2, err := ParseRule(r.String()); err != nil || !r2.Equal(r) {
				t.Errorf("does not round-trip: %v %v", r2, err)
			}
		})
	}
}

func TestMatches(t *testing.T) {
	cases := []struct {
		pat, ref string
		want     bool
	}{
		{"refs/heads/agent/*", "refs/heads/agent/x", true},
		{"refs/heads/agent/*", "refs/heads/agent/x/y", false},
		{"refs/heads/agent/*", "refs/heads/agent", false},
		{"refs/heads/agent/*", "refs/heads/agentx", false},
		{"refs/heads/agent/**", "refs/heads/agent/x/y", true},
		{"refs/heads/agent/**", "refs/heads/agent", true},
		{"refs/heads/main", "refs/heads/main", true},
		{"refs/heads/main", "refs/heads/main2", false},
		{"refs/**/x", "refs/heads/a/x", true},
		{"refs/**/x", "refs/x", true},
	}
	for _, c := range cases {
		if got := mustRule(t, c.pat).Matches(c.ref); got != c.want {
			t.Errorf("%s matches %s: %v, want %v", c.pat, c.ref, got, c.want)
		}
	}
}

func TestCheck(t *testing.T) {
	set := NewSet("code.test", []Rule{mustRule(t, "refs/heads/agent/*"), mustRule(t, "refs/heads/agent/keep no-create"), mustRule(t, "refs/heads/scratch/* delete")})
	cmd := func(old, nw, ref string) Command { return Command{old, nw, ref} }
	cases := []struct {
		name   string
		cmds   []Command
		reason string // "" allowed
	}{
		{"update", []Command{cmd(oidA, oidB, "refs/heads/agent/x")}, ""},
		{"create", []Command{cmd(zero, oidB, "refs/heads/agent/x")}, ""},
		{"main", []Command{cmd(oidA, oidB, "refs/heads/main")}, ReasonRefNotAllowed},
		{"tag", []Command{cmd(zero, oidB, "refs/tags/v1")}, ReasonRefNotAllowed},
		{"delete", []Command{cmd(oidA, zero, "refs/heads/agent/x")}, ReasonDeleteNotAllowed},
		{"delete allowed", []Command{cmd(oidA, zero, "refs/heads/scratch/x")}, ""},
		{"no-create, but another rule creates", []Command{cmd(zero, oidB, "refs/heads/agent/keep")}, ""},
		{"one of many", []Command{cmd(oidA, oidB, "refs/heads/agent/x"), cmd(oidA, oidB, "refs/heads/main")}, ReasonRefNotAllowed},
		{"probe", nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := set.Check(&Request{Commands: c.cmds})
			if d.Allowed != (c.reason == "") || d.Reason != c.reason {
				t.Fatalf("allowed %v reason %q, want %q (%s)", d.Allowed, d.Reason, c.reason, d.Summary())
			}
			for _, v := range d.Verdicts {
				if v.Allowed != d.Allowed {
					t.Errorf("%s: allowed %v in a push decided %v", v.Command.Ref, v.Allowed, d.Allowed)
				}
			}
		})
	}
	noCreate := NewSet("h", []Rule{mustRule(t, "refs/heads/agent/* no-create")})
	if d := noCreate.Check(&Request{Commands: []Command{cmd(zero, oidB, "refs/heads/agent/x")}}); d.Reason != ReasonCreateNotAllowed {
		t.Errorf("create under no-create: %q, want %s", d.Reason, ReasonCreateNotAllowed)
	}
}
