package hostfw

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the golden file (if intended, run go test -update and review the diff)\n--- got:\n%s\n--- want:\n%s", name, got, want)
	}
}

type exitErr int

func (e exitErr) Error() string { return "exit status " + strconv.Itoa(int(e)) }
func (e exitErr) ExitCode() int { return int(e) }

// fakeTables keeps iptables state per tool, enough for the verbs hostfw
// uses, and records every command for the golden files.
type fakeTables struct {
	chains map[string]map[string][]string // tool -> chain -> rules ("-A chain ...")
	log    []string
	fail   string // a command prefix that fails with exit status 4
}

func newFakeTables() *fakeTables {
	f := &fakeTables{chains: map[string]map[string][]string{}}
	for _, tool := range []string{"iptables", "ip6tables"} {
		f.chains[tool] = map[string][]string{"FORWARD": {"-A FORWARD -j LIBVIRT_FWX"}}
	}
	return f
}

func (f *fakeTables) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	f.log = append(f.log, cmd)
	if f.fail != "" && strings.HasPrefix(cmd, f.fail) {
		return nil, fmt.Errorf("%s: %w", cmd, exitErr(4))
	}
	if len(args) < 4 || args[0] != "-w" || args[2] != "-t" || args[3] != "mangle" {
		return nil, errors.New("fake: want -w N -t mangle")
	}
	args = args[4:]
	tables := f.chains[name]
	verb, chain, rest := args[0], args[1], args[2:]
	rules, exists := tables[chain]
	spec := strings.Join(append([]string{"-A", chain}, rest...), " ")
	idx := slices.Index(rules, spec)
	switch verb {
	case "-S":
		if !exists {
			return nil, exitErr(1)
		}
		head := "-N " + chain
		if chain == "FORWARD" {
			head = "-P FORWARD ACCEPT"
		}
		return []byte(strings.Join(append([]string{head}, rules...), "\n") + "\n"), nil
	case "-N":
		if exists {
			return nil, exitErr(1)
		}
		tables[chain] = nil
	case "-C":
		// Like iptables: a jump to a chain that does not exist is a
		// usage error (2), not an absent rule (1).
		if j := slices.Index(rest, "-j"); j >= 0 && j+1 < len(rest) && strings.HasPrefix(rest[j+1], "ABOX-") {
			if _, ok := tables[rest[j+1]]; !ok {
				return nil, exitErr(2)
			}
		}
		if !exists || idx < 0 {
			return nil, exitErr(1)
		}
	case "-A":
		tables[chain] = append(rules, spec)
	case "-I":
		pos := 1
		if n, err := strconv.Atoi(rest[0]); err == nil {
			pos, rest = n, rest[1:]
			spec = strings.Join(append([]string{"-A", chain}, rest...), " ")
		}
		tables[chain] = slices.Insert(rules, pos-1, spec)
	case "-D":
		if n, err := strconv.Atoi(rest[0]); err == nil && len(rest) == 1 {
			idx = n - 1
		}
		if idx < 0 || idx >= len(rules) {
			return nil, exitErr(1)
		}
		tables[chain] = slices.Delete(rules, idx, idx+1)
	case "-F":
		tables[chain] = nil
	case "-X":
		for _, rs := range tables {
			for _, r := range rs {
				if strings.HasSuffix(r, "-j "+chain) {
					return nil, exitErr(1) // still referenced
				}
			}
		}
		delete(tables, chain)
	default:
		return nil, fmt.Errorf("fake: verb %s", verb)
	}
	return nil, nil
}

const br = "abx-ef260e9aa3c"

func TestEnsureCheckRemove(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := New(tables)

	st, err := fw.Check(ctx, br)
	if err != nil || st.Intact() {
		t.Fatalf("Check before Ensure = %+v, %v; want not intact", st, err)
	}
	tables.log = nil

	if err := fw.Ensure(ctx, br); err != nil {
		t.Fatal(err)
	}
	golden(t, "ensure-fresh.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, tool := range []string{"iptables", "ip6tables"} {
		fwd := tables.chains[tool]["FORWARD"]
		want := []string{"-A FORWARD -o " + br + " -j ABOX-" + br, "-A FORWARD -i " + br + " -j ABOX-" + br, "-A FORWARD -j LIBVIRT_FWX"}
		if !slices.Equal(fwd, want) {
			t.Errorf("%s FORWARD = %q, want our jumps first: %q", tool, fwd, want)
		}
		if got := tables.chains[tool]["ABOX-"+br]; !slices.Equal(got, []string{"-A ABOX-" + br + " -j DROP"}) {
			t.Errorf("%s chain = %q", tool, got)
		}
	}
	if st, err := fw.Check(ctx, br); err != nil || !st.Intact() {
		t.Fatalf("Check after Ensure = %+v, %v; want intact", st, err)
	}

	// A second Ensure only looks.
	tables.log = nil
	if err := fw.Ensure(ctx, br); err != nil {
		t.Fatal(err)
	}
	golden(t, "ensure-again.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, c := range tables.log {
		if !strings.Contains(c, " -C ") && !strings.Contains(c, " -S ") {
			t.Errorf("idempotent Ensure changed something: %s", c)
		}
	}

	tables.log = nil
	if err := fw.Remove(ctx, br); err != nil {
		t.Fatal(err)
	}
	golden(t, "remove.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, tool := range []string{"iptables", "ip6tables"} {
		if _, ok := tables.chains[tool]["ABOX-"+br]; ok {
			t.Errorf("%s chain still exists", tool)
		}
		if fwd := tables.chains[tool]["FORWARD"]; !slices.Equal(fwd, []string{"-A FORWARD -j LIBVIRT_FWX"}) {
			t.Errorf("%s FORWARD after Remove = %q", tool, fwd)
		}
	}
	if err := fw.Remove(ctx, br); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

func TestEnsureRepairs(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		tamper func(f *fakeTables)
	}{
		{"accept inserted before drop", func(f *fakeTables) {
			c := "ABOX-" + br
			f.chains["iptables"][c] = slices.Insert(f.chains["iptables"][c], 0, "-A "+c+" -j ACCEPT")
		}},
		{"drop replaced by accept", func(f *fakeTables) {
			f.chains["iptables"]["ABOX-"+br] = []string{"-A ABOX-" + br + " -j ACCEPT", "-A ABOX-" + br + " -j RETURN"}
		}},
		{"chain flushed", func(f *fakeTables) { f.chains["ip6tables"]["ABOX-"+br] = nil }},
		{"jump deleted", func(f *fakeTables) {
			f.chains["iptables"]["FORWARD"] = slices.DeleteFunc(f.chains["iptables"]["FORWARD"], func(r string) bool { return strings.Contains(r, "-i "+br) })
		}},
		{"everything deleted", func(f *fakeTables) { *f = *newFakeTables() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tables := newFakeTables()
			fw := New(tables)
			if err := fw.Ensure(ctx, br); err != nil {
				t.Fatal(err)
			}
			tt.tamper(tables)
			st, err := fw.Check(ctx, br)
			if err != nil || st.Intact() {
				t.Fatalf("Check after tampering = %+v, %v; want problems", st, err)
			}
			if err := fw.Ensure(ctx, br); err != nil {
				t.Fatal(err)
			}
			if st, err := fw.Check(ctx, br); err != nil || !st.Intact() {
				t.Fatalf("Check after repair = %+v, %v", st, err)
			}
		})
	}
}

func TestErrorsAreNotAbsence(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	tables.fail = "iptables -w 10 -t mangle -S"
	fw := New(tables)
	if err := fw.Ensure(ctx, br); err == nil {
		t.Error("Ensure succeeded although iptables failed")
	}
	if _, err := fw.Check(ctx, br); err == nil {
		t.Error("Check succeeded although iptables failed")
	}
	if err := fw.Remove(ctx, br); err == nil {
		t.Error("Remove succeeded although iptables failed")
	}
}

func TestBadBridgeRefused(t *testing.T) {
	fw := New(newFakeTables())
	for _, b := range []string{"", "-j ACCEPT", "abx-0123456789abcdef", "br;x"} {
		if err := fw.Ensure(context.Background(), b); err == nil {
			t.Errorf("Ensure(%q) accepted", b)
		}
	}
}

func TestChainNameFits(t *testing.T) {
	if n := len(ChainName("abx-0123456789a")); n > 28 {
		t.Errorf("chain name %d chars, iptables allows 28", n)
	}
}
