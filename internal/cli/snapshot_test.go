package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
)

// Bad arguments are refused, naming the fix, before libvirtd is dialled
// (the test has none: a dial would fail with another message).
func TestSnapshotArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"snapshot"}, "needs a subcommand"},
		{[]string{"snapshot", "create"}, "takes an instance NAME"},
		{[]string{"snapshot", "create", "dev", "a/../b"}, `validating snapshot name "a/../b"`},
		{[]string{"snapshot", "create", "dev", "x'/><y"}, "validating snapshot name"},
		{[]string{"snapshot", "create", "dev", "7"}, "snapshot id"},
		{[]string{"snapshot", "create", "dev", "ok", "--description", "two\nlines"}, "printable"},
		{[]string{"snapshot", "create", "../dev"}, "validating instance name"},
		{[]string{"snapshot", "list"}, "takes an instance NAME"},
		{[]string{"snapshot", "revert", "dev"}, "takes an instance NAME and a SNAPSHOT name"},
		{[]string{"snapshot", "revert", "dev", "..", "x"}, "takes an instance NAME and a SNAPSHOT name"},
		{[]string{"snapshot", "remove", "dev"}, "either SNAPSHOT names or --all"},
		{[]string{"snapshot", "remove", "dev", "a", "--all"}, "either SNAPSHOT names or --all"},
		{[]string{"snapshot", "rm", "dev", "a&b"}, "validating snapshot name"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			e := &env{stdout: &out, stderr: &errb, layout: func() (paths.Layout, error) { return paths.Layout{Root: t.TempDir()}, nil }}
			root := newRootCmd(e)
			root.SetArgs(tc.args)
			root.SetOut(&out)
			root.SetErr(&errb)
			err := root.Execute()
			if _, usage := err.(usageError); !usage || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v (usage error: %v), want one containing %q", err, usage, tc.want)
			}
		})
	}
}

func TestRenderSnapshots(t *testing.T) {
	var b bytes.Buffer
	at := time.Date(2026, 12, 2, 15, 4, 5, 0, time.UTC)
	err := renderSnapshots(&b, []instance.SnapshotInfo{
		{Snapshot: libvirt.Snapshot{Name: "cold", Created: at, State: libvirt.StateShutoff}},
		{Snapshot: libvirt.Snapshot{Name: "warm", Created: at, State: libvirt.StateRunning, Current: true, Description: "deps in\x1b[2J"}, MemoryBytes: 300<<20 + 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("table:\n%s", b.String())
	}
	if f := strings.Fields(lines[1]); f[0] != "cold" || f[3] != "shutoff" || f[4] != "-" {
		t.Errorf("stopped row %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "warm" || f[3] != "running" || f[4] != "301" || f[6] != "*" {
		t.Errorf("running row %q", lines[2])
	}
	if strings.Contains(b.String(), "\x1b") {
		t.Errorf("a control character reached the table: %q", b.String())
	}
}

// An unknown snapshot or instance gets its fix as a hint, once.
func TestSnapshotHint(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("instance dev: %w nope", instance.ErrSnapshotNotFound), "`abox snapshot list dev` shows its snapshots"},
		{fmt.Errorf("instance dev: %w", instance.ErrNotFound), "abox create dev"},
	} {
		var he *hintError
		if err := snapshotHint("dev", tc.err); !errors.As(err, &he) || !strings.Contains(he.hint, tc.want) || strings.Contains(err.Error(), tc.want) {
			t.Errorf("snapshotHint(%v) = %v, want the hint %q once", tc.err, err, tc.want)
		}
	}
}
