package cli

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// Every command `abox --help` shows sits in a group: a new command gets
// one in commandGroup, or help lists it loose under "Additional Commands".
func TestEveryCommandHasAGroup(t *testing.T) {
	root := newRootCmd(&env{layout: paths.Default})
	for _, c := range root.Commands() {
		if !c.IsAvailableCommand() {
			continue
		}
		if c.GroupID == "" {
			t.Errorf("abox %s is in no help group: add it to commandGroup", c.Name())
		}
	}
	out, err := runCLI(paths.Layout{Root: t.TempDir()}, "--help")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "Additional Commands") {
		t.Errorf("help lists commands outside the groups:\n%s", out)
	}
	for _, g := range commandGroups {
		if !strings.Contains(out, g.Title) {
			t.Errorf("help lacks the group %q:\n%s", g.Title, out)
		}
	}
}

// Instance names complete wherever a command takes one first, from the
// instances on disk; a base image's or a secret's NAME does not.
func TestInstanceNamesComplete(t *testing.T) {
	root := t.TempDir()
	l := paths.Layout{Root: root}
	for _, n := range []string{"dev", "demo", "web"} {
		saveState(t, root, instance.State{Name: n, Gateway: netip.MustParseAddr("10.10.9.1")})
	}
	// Not an instance: a stray directory with a name no instance can have.
	os.MkdirAll(filepath.Join(l.Instances(), "Bad Name"), 0o700)
	for _, tc := range []struct {
		args []string
		want []string
		not  []string
	}{
		{[]string{"__complete", "start", "de"}, []string{"dev", "demo"}, []string{"web", "Bad Name"}},
		{[]string{"__complete", "allowlist", "add", ""}, []string{"dev", "demo", "web"}, []string{"Bad Name"}},
		{[]string{"__complete", "ssh", "w"}, []string{"web"}, []string{"dev"}},
		{[]string{"__complete", "start", "dev", ""}, nil, []string{"demo", "web"}},
		{[]string{"__complete", "base", "remove", ""}, nil, []string{"dev", "demo", "web"}},
		{[]string{"__complete", "secret", "set", ""}, nil, []string{"dev", "demo", "web"}},
	} {
		out, err := runCLI(l, tc.args...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, out)
		}
		lines := strings.Split(out, "\n")
		has := func(s string) bool {
			for _, l := range lines {
				if l == s {
					return true
				}
			}
			return false
		}
		for _, w := range tc.want {
			if !has(w) {
				t.Errorf("%v: %q not completed:\n%s", tc.args, w, out)
			}
		}
		for _, n := range tc.not {
			if has(n) {
				t.Errorf("%v: %q completed:\n%s", tc.args, n, out)
			}
		}
	}
}
