package hostfw

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
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
	sysctl map[string]string              // key (slash form) -> value; unset keys read "0"
	nft    map[string]string              // nftables table (family ip) -> as nft list table prints it
	log    []string
	fail   string // a command prefix that fails with exit status 4
	// after, if set, is called after every command that succeeded, with
	// the tool and the arguments after "-w N -t mangle".
	after func(tool string, args []string)
}

func newFakeTables() *fakeTables {
	f := &fakeTables{chains: map[string]map[string][]string{}, sysctl: map[string]string{}, nft: map[string]string{}}
	for _, tool := range []string{"iptables", "ip6tables"} {
		f.chains[tool] = map[string][]string{
			"FORWARD": {"-A FORWARD -j LIBVIRT_FWX"},
			"OUTPUT":  {"-A OUTPUT -j OTHER_OUT"},
			"INPUT":   {"-A INPUT -j OTHER_IN"},
		}
	}
	return f
}

func (f *fakeTables) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	f.log = append(f.log, cmd)
	if f.fail != "" && strings.HasPrefix(cmd, f.fail) {
		return nil, fmt.Errorf("%s: %w", cmd, exitErr(4))
	}
	if name == "sysctl" {
		return f.doSysctl(args)
	}
	if name == "nft" {
		return f.doNft(args)
	}
	if len(args) < 4 || args[0] != "-w" || args[2] != "-t" || args[3] != "mangle" {
		return nil, errors.New("fake: want -w N -t mangle")
	}
	args = args[4:]
	out, err := f.do(name, args)
	if err == nil && f.after != nil {
		f.after(name, args)
	}
	return out, err
}

func (f *fakeTables) do(name string, args []string) ([]byte, error) {
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
		if builtin(chain) {
			head = "-P " + chain + " ACCEPT"
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
		if j := slices.Index(rest, "-j"); j >= 0 && j+1 < len(rest) && strings.HasPrefix(rest[j+1], "ABOX") {
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

// RunInput plays `iptables-restore -w 10 --noflush` with its script on
// standard input, as a transaction: the lines are applied to a copy of the
// tool's chains, which replaces them only if every line succeeded (else
// exit status 1 and nothing changed). A ":CHAIN - [0:0]" line creates a
// user chain or empties it. The command is logged with its script, and
// after sees the whole transaction once, as "COMMIT" and its lines.
func (f *fakeTables) RunInput(_ context.Context, input []byte, name string, args ...string) ([]byte, error) {
	cmd := name + " " + strings.Join(args, " ")
	f.log = append(f.log, cmd+" <<EOF\n"+string(input)+"EOF")
	if f.fail != "" && strings.HasPrefix(cmd, f.fail) {
		return nil, fmt.Errorf("%s: %w", cmd, exitErr(4))
	}
	if name == "nft" {
		return nil, f.nftScript(args, string(input))
	}
	tool, ok := strings.CutSuffix(name, "-restore")
	if !ok || f.chains[tool] == nil {
		return nil, fmt.Errorf("fake: no input for %s", name)
	}
	// Without --noflush iptables-restore replaces the whole table.
	if !slices.Equal(args, []string{"-w", "10", "--noflush"}) {
		return nil, fmt.Errorf("fake: want %s -w 10 --noflush, got %q", name, args)
	}
	lines := strings.Split(strings.TrimSuffix(string(input), "\n"), "\n")
	if len(lines) < 2 || lines[0] != "*mangle" || lines[len(lines)-1] != "COMMIT" {
		return nil, fmt.Errorf("fake: restore script %q is not one mangle transaction", input)
	}
	lines = lines[1 : len(lines)-1]
	orig := f.chains[tool]
	work := map[string][]string{}
	for c, rs := range orig {
		work[c] = slices.Clone(rs)
	}
	f.chains[tool] = work
	for _, l := range lines {
		var err error
		if chain, ok := strings.CutPrefix(l, ":"); ok {
			chain, _, _ = strings.Cut(chain, " ")
			if builtin(chain) {
				err = errors.New("fake: policy lines not played")
			} else {
				work[chain] = nil
			}
		} else {
			_, err = f.do(tool, strings.Fields(l))
		}
		if err != nil {
			f.chains[tool] = orig
			return nil, fmt.Errorf("%s: line %q failed (%v): %w", cmd, l, err, exitErr(1))
		}
	}
	if f.after != nil {
		f.after(tool, append([]string{"COMMIT"}, lines...))
	}
	return nil, nil
}

// doNft plays `nft list tables ip`, `nft list table ip NAME` and `nft
// delete table ip NAME`.
func (f *fakeTables) doNft(args []string) ([]byte, error) {
	switch cmd := strings.Join(args, " "); {
	case cmd == "list tables ip":
		var out []string
		for _, name := range slices.Sorted(maps.Keys(f.nft)) {
			out = append(out, "table ip "+name)
		}
		return []byte(strings.Join(out, "\n") + "\n"), nil
	case strings.HasPrefix(cmd, "list table ip "), strings.HasPrefix(cmd, "delete table ip "):
		name := args[len(args)-1]
		text, ok := f.nft[name]
		if !ok {
			return nil, exitErr(1)
		}
		if args[0] == "delete" {
			delete(f.nft, name)
			return nil, nil
		}
		return []byte(text), nil
	}
	return nil, fmt.Errorf("fake: nft %q", args)
}

// nftScript plays `nft -f -` with the one script shape hostfw writes:
// create the table, delete it and define it whole, as one transaction.
func (f *fakeTables) nftScript(args []string, script string) error {
	if !slices.Equal(args, []string{"-f", "-"}) {
		return fmt.Errorf("fake: nft %q", args)
	}
	first, rest, _ := strings.Cut(script, "\n")
	name, ok := strings.CutPrefix(first, "table ip ")
	if !ok {
		return fmt.Errorf("fake: nft script %q", script)
	}
	body, ok := strings.CutPrefix(rest, "delete table ip "+name+"\n")
	if !ok || !strings.HasPrefix(body, "table ip "+name+" {\n") || !strings.HasSuffix(body, "}\n") {
		return fmt.Errorf("fake: nft script %q does not replace table %s whole", script, name)
	}
	f.nft[name] = body
	return nil
}

// doSysctl plays `sysctl -n KEY...` and `sysctl -q -w KEY=VALUE...`.
func (f *fakeTables) doSysctl(args []string) ([]byte, error) {
	var out []string
	write := slices.Contains(args, "-w")
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if write {
			k, v, _ := strings.Cut(a, "=")
			f.sysctl[k] = v
			continue
		}
		v, ok := f.sysctl[a]
		if !ok {
			v = "0"
		}
		out = append(out, v)
	}
	if write {
		return nil, nil
	}
	return []byte(strings.Join(out, "\n") + "\n"), nil
}

func builtin(chain string) bool { return chain == "FORWARD" || chain == "OUTPUT" || chain == "INPUT" }

const br = "abx-ef260e9aa3c"

// bb is the bridge the tests ensure.
var bb = Bridge{Name: br, Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128, Guest: netip.MustParseAddr("10.10.7.10")}

// The chains as iptables -S prints them, spelled out here rather than
// taken from specs so that a change to the rules shows up in this test.
var (
	fwdChain = "ABOX-" + br
	outChain = "ABOXO-" + br
	inChain  = "ABOXI-" + br
	wantFwd  = []string{"-A " + fwdChain + " -j DROP"}
	wantOut  = map[string][]string{
		"iptables": {
			"-A " + outChain + " -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
			"-A " + outChain + " -p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -j RETURN",
			"-A " + outChain + " -j DROP",
		},
		"ip6tables": {"-A " + outChain + " -j DROP"},
	}
	wantIn = map[string][]string{
		"iptables": {
			"-A " + inChain + " ! -s 10.10.7.10/32 -j DROP",
			"-A " + inChain + " -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN",
			"-A " + inChain + " -m conntrack --ctstate NEW -m connlimit --connlimit-above 4096 --connlimit-mask 0 --connlimit-saddr -j DROP",
			"-A " + inChain + " -d 10.10.7.1/32 -p udp -m udp --dport 53 -j RETURN",
			"-A " + inChain + " -d 10.10.7.1/32 -p tcp -m tcp --dport 3128 -m conntrack --ctstate NEW -j RETURN",
			"-A " + inChain + " -d 10.10.7.1/32 -p icmp -m icmp --icmp-type 8 -j RETURN",
			"-A " + inChain + " -d 10.10.7.1/32 -p tcp -m tcp --dport 53 -m conntrack --ctstate NEW -j RETURN",
			"-A " + inChain + " -j DROP",
		},
		"ip6tables": {"-A " + inChain + " -j DROP"},
	}
)

func TestEnsureCheckRemove(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)

	st, err := fw.Check(ctx, bb)
	if err != nil || st.Intact() {
		t.Fatalf("Check before Ensure = %+v, %v; want not intact", st, err)
	}
	if len(st.Problems) != 9 {
		t.Errorf("Check before Ensure: %d problems, want one per chain and tool, two ARP switches and the answer table: %q", len(st.Problems), st.Problems)
	}
	tables.log = nil

	tables.after = safetyChecker(t, tables, bb)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	golden(t, "ensure-fresh.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, tool := range []string{"iptables", "ip6tables"} {
		fwd := tables.chains[tool]["FORWARD"]
		want := []string{"-A FORWARD -o " + br + " -j " + fwdChain, "-A FORWARD -i " + br + " -j " + fwdChain, "-A FORWARD -j LIBVIRT_FWX"}
		if !slices.Equal(fwd, want) {
			t.Errorf("%s FORWARD = %q, want our jumps first: %q", tool, fwd, want)
		}
		out := tables.chains[tool]["OUTPUT"]
		want = []string{"-A OUTPUT -o " + br + " -j " + outChain, "-A OUTPUT -j OTHER_OUT"}
		if !slices.Equal(out, want) {
			t.Errorf("%s OUTPUT = %q, want our jump first: %q", tool, out, want)
		}
		if got := tables.chains[tool][fwdChain]; !slices.Equal(got, wantFwd) {
			t.Errorf("%s chain %s = %q, want %q", tool, fwdChain, got, wantFwd)
		}
		if got := tables.chains[tool][outChain]; !slices.Equal(got, wantOut[tool]) {
			t.Errorf("%s chain %s = %q, want %q", tool, outChain, got, wantOut[tool])
		}
		in := tables.chains[tool]["INPUT"]
		want = []string{"-A INPUT -i " + br + " -j " + inChain, "-A INPUT -j OTHER_IN"}
		if !slices.Equal(in, want) {
			t.Errorf("%s INPUT = %q, want our jump first: %q", tool, in, want)
		}
		if got := tables.chains[tool][inChain]; !slices.Equal(got, wantIn[tool]) {
			t.Errorf("%s chain %s = %q, want %q", tool, inChain, got, wantIn[tool])
		}
	}
	if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
		t.Fatalf("Check after Ensure = %+v, %v; want intact", st, err)
	}

	// A second Ensure only looks.
	tables.log = nil
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	golden(t, "ensure-again.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, c := range tables.log {
		if !strings.Contains(c, " -C ") && !strings.Contains(c, " -S ") && !strings.HasPrefix(c, "sysctl -n ") && !strings.HasPrefix(c, "nft list ") {
			t.Errorf("idempotent Ensure changed something: %s", c)
		}
	}

	tables.log = nil
	if err := fw.Remove(ctx, br); err != nil {
		t.Fatal(err)
	}
	golden(t, "remove.cmds", strings.Join(tables.log, "\n")+"\n")
	for _, tool := range []string{"iptables", "ip6tables"} {
		for _, c := range []string{fwdChain, outChain, inChain} {
			if _, ok := tables.chains[tool][c]; ok {
				t.Errorf("%s chain %s still exists", tool, c)
			}
		}
		if fwd := tables.chains[tool]["FORWARD"]; !slices.Equal(fwd, []string{"-A FORWARD -j LIBVIRT_FWX"}) {
			t.Errorf("%s FORWARD after Remove = %q", tool, fwd)
		}
		if out := tables.chains[tool]["OUTPUT"]; !slices.Equal(out, []string{"-A OUTPUT -j OTHER_OUT"}) {
			t.Errorf("%s OUTPUT after Remove = %q", tool, out)
		}
		if in := tables.chains[tool]["INPUT"]; !slices.Equal(in, []string{"-A INPUT -j OTHER_IN"}) {
			t.Errorf("%s INPUT after Remove = %q", tool, in)
		}
	}
	if err := fw.Remove(ctx, br); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// safetyChecker returns a fakeTables.after hook that fails the test if a
// command leaves one of our chains letting through more than its wanted
// rules do (everything before its first DROP must be a wanted rule), or
// adds a jump to a chain that is not complete yet.
func safetyChecker(t *testing.T, f *fakeTables, b Bridge) func(string, []string) {
	return func(tool string, args []string) {
		t.Helper()
		// Each command, or each line of a transaction (checked on the
		// state after its COMMIT, the only one packets see).
		cmds := [][]string{args}
		if args[0] == "COMMIT" {
			cmds = nil
			for _, l := range args[1:] {
				cmds = append(cmds, strings.Fields(l))
			}
		}
		touched := map[string]bool{}
		for _, c := range cmds {
			if chain, ok := strings.CutPrefix(c[0], ":"); ok {
				touched[chain] = true
			}
			if c[0] == "-I" || c[0] == "-A" || c[0] == "-D" {
				touched[c[1]] = true
			}
			if c[0] == "-I" && builtin(c[1]) {
				target := c[len(c)-1]
				for _, s := range specs(tool, b) {
					if s.name == target && !slices.Equal(f.chains[tool][target], s.rules()) {
						t.Errorf("%s %v: jump added to incomplete chain %q", tool, args, f.chains[tool][target])
					}
				}
			}
		}
		for _, c := range specs(tool, b) {
			if !touched[c.name] {
				continue
			}
			rules := f.chains[tool][c.name]
			want := c.rules()
			drop := slices.Index(rules, want[len(want)-1])
			if drop < 0 {
				t.Errorf("%s %v: chain left without DROP: %q", tool, args, rules)
				continue
			}
			for _, r := range rules[:drop] {
				if !slices.Contains(want, r) {
					t.Errorf("%s %v: chain lets through %q before its DROP: %q", tool, args, r, rules)
				}
			}
		}
	}
}

func TestEnsureRepairs(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		tamper func(f *fakeTables)
		golden string // if set, the repair's commands are compared to this file
	}{
		{"accept inserted before drop", func(f *fakeTables) {
			f.chains["iptables"][fwdChain] = slices.Insert(f.chains["iptables"][fwdChain], 0, "-A "+fwdChain+" -j ACCEPT")
		}, ""},
		{"drop replaced by accept", func(f *fakeTables) {
			f.chains["iptables"][fwdChain] = []string{"-A " + fwdChain + " -j ACCEPT", "-A " + fwdChain + " -j RETURN"}
		}, ""},
		{"chain flushed", func(f *fakeTables) { f.chains["ip6tables"][fwdChain] = nil }, ""},
		{"jump deleted", func(f *fakeTables) {
			f.chains["iptables"]["FORWARD"] = slices.DeleteFunc(f.chains["iptables"]["FORWARD"], func(r string) bool { return strings.Contains(r, "-i "+br) })
		}, ""},
		{"output: accept inserted at the top", func(f *fakeTables) {
			f.chains["iptables"][outChain] = slices.Insert(f.chains["iptables"][outChain], 0, "-A "+outChain+" -j ACCEPT")
		}, "repair-output-top.cmds"},
		{"output: accept between the returns, ssh rule gone", func(f *fakeTables) {
			f.chains["iptables"][outChain] = []string{wantOut["iptables"][0], "-A " + outChain + " -p tcp -m tcp --dport 8080 -j RETURN", "-A " + outChain + " -j DROP"}
		}, "repair-output-middle.cmds"},
		{"output: drop deleted", func(f *fakeTables) {
			f.chains["iptables"][outChain] = wantOut["iptables"][:2]
		}, ""},
		{"output: rule appended after drop", func(f *fakeTables) {
			f.chains["iptables"][outChain] = append(slices.Clone(wantOut["iptables"]), "-A "+outChain+" -j ACCEPT")
		}, ""},
		{"output: ipv6 accept", func(f *fakeTables) { f.chains["ip6tables"][outChain] = []string{"-A " + outChain + " -j ACCEPT"} }, ""},
		{"output: chain flushed", func(f *fakeTables) { f.chains["iptables"][outChain] = nil }, ""},
		{"output: jump deleted", func(f *fakeTables) { f.chains["ip6tables"]["OUTPUT"] = []string{"-A OUTPUT -j OTHER_OUT"} }, ""},
		{"input: accept inserted at the top", func(f *fakeTables) {
			f.chains["iptables"][inChain] = slices.Insert(f.chains["iptables"][inChain], 0, "-A "+inChain+" -j ACCEPT")
		}, ""},
		{"input: proxy rule for another port, accept after it", func(f *fakeTables) {
			f.chains["iptables"][inChain] = []string{wantIn["iptables"][0], wantIn["iptables"][1], wantIn["iptables"][2],
				"-A " + inChain + " -d 10.10.7.1/32 -p tcp -m tcp --dport 8081 -m conntrack --ctstate NEW -j RETURN",
				wantIn["iptables"][4], "-A " + inChain + " -j ACCEPT"}
		}, "repair-input-middle.cmds"},
		{"input: dns rule for any address", func(f *fakeTables) {
			f.chains["iptables"][inChain][3] = "-A " + inChain + " -p udp -m udp --dport 53 -j RETURN"
		}, ""},
		{"input: drop deleted", func(f *fakeTables) {
			f.chains["iptables"][inChain] = wantIn["iptables"][:5]
		}, ""},
		{"input: source check deleted", func(f *fakeTables) {
			f.chains["iptables"][inChain] = slices.Clone(wantIn["iptables"][1:])
		}, ""},
		{"input: source check for another address", func(f *fakeTables) {
			f.chains["iptables"][inChain][0] = "-A " + inChain + " ! -s 10.10.7.0/24 -j DROP"
		}, ""},
		{"input: ipv6 accept", func(f *fakeTables) { f.chains["ip6tables"][inChain] = []string{"-A " + inChain + " -j ACCEPT"} }, ""},
		{"input: chain flushed", func(f *fakeTables) { f.chains["iptables"][inChain] = nil }, ""},
		{"input: jump deleted", func(f *fakeTables) { f.chains["iptables"]["INPUT"] = []string{"-A INPUT -j OTHER_IN"} }, ""},
		{"everything deleted", func(f *fakeTables) { *f = *newFakeTables() }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tables := newFakeTables()
			fw := testFirewall(t, tables)
			if err := fw.Ensure(ctx, bb); err != nil {
				t.Fatal(err)
			}
			tt.tamper(tables)
			st, err := fw.Check(ctx, bb)
			if err != nil || st.Intact() {
				t.Fatalf("Check after tampering = %+v, %v; want problems", st, err)
			}
			tables.log = nil
			tables.after = safetyChecker(t, tables, bb)
			if err := fw.Ensure(ctx, bb); err != nil {
				t.Fatal(err)
			}
			tables.after = nil
			if tt.golden != "" {
				golden(t, tt.golden, strings.Join(tables.log, "\n")+"\n")
			}
			if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
				t.Fatalf("Check after repair = %+v, %v", st, err)
			}
			for _, tool := range []string{"iptables", "ip6tables"} {
				if got := tables.chains[tool][outChain]; !slices.Equal(got, wantOut[tool]) {
					t.Errorf("%s chain %s after repair = %q, want %q", tool, outChain, got, wantOut[tool])
				}
				if got := tables.chains[tool][inChain]; !slices.Equal(got, wantIn[tool]) {
					t.Errorf("%s chain %s after repair = %q, want %q", tool, inChain, got, wantIn[tool])
				}
			}
		})
	}
}

// TestEnsureFollowsProxyPortAndGateway: the input chain is written for one
// gateway and proxy port; Check against others must report it, and Ensure
// for them must rewrite the chain so that the old port is closed.
func TestEnsureFollowsProxyPortAndGateway(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	moved := Bridge{Name: br, Gateway: netip.MustParseAddr("10.10.9.1"), ProxyPort: 8888, Guest: netip.MustParseAddr("10.10.9.10")}
	st, err := fw.Check(ctx, moved)
	// The gateway, guest and proxy port are in the input chain and the
	// answer table.
	if err != nil || len(st.Problems) != 2 || !strings.HasPrefix(st.Problems[0], "iptables: chain "+inChain+" holds") ||
		!strings.HasPrefix(st.Problems[1], "nft: table ip "+AnswerTableName(br)+" holds") {
		t.Fatalf("Check for another gateway and port = %q, %v; want the input chain and the answer table reported", st.Problems, err)
	}
	tables.after = safetyChecker(t, tables, moved)
	if err := fw.Ensure(ctx, moved); err != nil {
		t.Fatal(err)
	}
	tables.after = nil
	want := []string{
		"-A " + inChain + " ! -s 10.10.9.10/32 -j DROP",
		wantIn["iptables"][1],
		wantIn["iptables"][2],
		"-A " + inChain + " -d 10.10.9.1/32 -p udp -m udp --dport 53 -j RETURN",
		"-A " + inChain + " -d 10.10.9.1/32 -p tcp -m tcp --dport 8888 -m conntrack --ctstate NEW -j RETURN",
		"-A " + inChain + " -d 10.10.9.1/32 -p icmp -m icmp --icmp-type 8 -j RETURN",
		"-A " + inChain + " -d 10.10.9.1/32 -p tcp -m tcp --dport 53 -m conntrack --ctstate NEW -j RETURN",
		"-A " + inChain + " -j DROP",
	}
	if got := tables.chains["iptables"][inChain]; !slices.Equal(got, want) {
		t.Errorf("input chain after Ensure for the new port = %q, want %q", got, want)
	}
	if st, err := fw.Check(ctx, bb); err != nil || st.Intact() {
		t.Errorf("Check for the old port after the move = %+v, %v; want not intact", st, err)
	}
}

// TestCheckReportsEveryProblem breaks several parts at once; Check must
// name each of them.
func TestCheckReportsEveryProblem(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.chains["iptables"][outChain] = wantOut["iptables"][1:]
	tables.chains["iptables"]["OUTPUT"] = []string{"-A OUTPUT -j OTHER_OUT"}
	tables.chains["iptables"]["FORWARD"] = tables.chains["iptables"]["FORWARD"][1:] // the -o jump
	tables.chains["ip6tables"]["OUTPUT"] = []string{"-A OUTPUT -j OTHER_OUT"}
	delete(tables.chains["ip6tables"], outChain)
	tables.chains["iptables"][inChain] = slices.Insert(wantIn["iptables"][:4:4], 1, "-A "+inChain+" -j ACCEPT")
	tables.chains["ip6tables"]["INPUT"] = []string{"-A INPUT -j OTHER_IN"}
	st, err := fw.Check(ctx, bb)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"iptables: FORWARD jump for traffic to " + br + " missing",
		"iptables: chain " + outChain + " holds",
		"iptables: OUTPUT jump for traffic from the host to " + br + " missing",
		"iptables: chain " + inChain + " holds",
		"ip6tables: chain " + outChain + " missing",
		"ip6tables: INPUT jump for traffic from " + br + " to the host missing",
	}
	if len(st.Problems) != len(want) {
		t.Fatalf("problems = %q, want %d", st.Problems, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(st.Problems[i], w) {
			t.Errorf("problem %d = %q, want it to start with %q", i, st.Problems[i], w)
		}
	}
}

// TestRemoveAttemptsEverything makes one step fail; Remove must still
// take away everything else and report the failure.
func TestRemoveAttemptsEverything(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	tables.fail = "iptables -w 10 -t mangle -D FORWARD"
	err := fw.Remove(ctx, br)
	if err == nil || !strings.Contains(err.Error(), "FORWARD jump") {
		t.Fatalf("Remove = %v, want the failed FORWARD jump reported", err)
	}
	for _, c := range []string{outChain, inChain} {
		if _, ok := tables.chains["iptables"][c]; ok {
			t.Errorf("iptables %s kept although only a FORWARD step failed", c)
		}
	}
	for _, c := range []string{fwdChain, outChain, inChain} {
		if _, ok := tables.chains["ip6tables"][c]; ok {
			t.Errorf("ip6tables %s kept although only an iptables step failed", c)
		}
	}
	tables.fail = ""
	if err := fw.Remove(ctx, br); err != nil {
		t.Fatalf("Remove after the failure cleared: %v", err)
	}
	for _, tool := range []string{"iptables", "ip6tables"} {
		for c := range tables.chains[tool] {
			if strings.HasPrefix(c, "ABOX") {
				t.Errorf("%s chain %s left after the second Remove", tool, c)
			}
		}
	}
}

func TestErrorsAreNotAbsence(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	tables.fail = "iptables -w 10 -t mangle -S"
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err == nil {
		t.Error("Ensure succeeded although iptables failed")
	}
	if _, err := fw.Check(ctx, bb); err == nil {
		t.Error("Check succeeded although iptables failed")
	}
	if err := fw.Remove(ctx, br); err == nil {
		t.Error("Remove succeeded although iptables failed")
	}
}

func TestBadBridgeRefused(t *testing.T) {
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	var bad []Bridge
	for _, name := range []string{"", "-j ACCEPT", "abx-0123456789abcdef", "br;x"} {
		bad = append(bad, Bridge{Name: name, Gateway: bb.Gateway, ProxyPort: bb.ProxyPort, Guest: bb.Guest})
	}
	bad = append(bad,
		Bridge{Name: br, ProxyPort: 3128, Guest: bb.Guest}, // no gateway
		Bridge{Name: br, Gateway: netip.MustParseAddr("0.0.0.0"), ProxyPort: 3128, Guest: bb.Guest},
		Bridge{Name: br, Gateway: netip.MustParseAddr("fd00::1"), ProxyPort: 3128, Guest: bb.Guest},
		Bridge{Name: br, Gateway: bb.Gateway, Guest: bb.Guest},                    // no proxy port
		Bridge{Name: br, Gateway: bb.Gateway, ProxyPort: 3128},                    // no guest
		Bridge{Name: br, Gateway: bb.Gateway, ProxyPort: 3128, Guest: bb.Gateway}, // guest is the gateway
		Bridge{Name: br, Gateway: bb.Gateway, ProxyPort: 3128, Guest: netip.MustParseAddr("fd00::10")},
	)
	for _, b := range bad {
		if err := fw.Ensure(context.Background(), b); err == nil {
			t.Errorf("Ensure(%+v) accepted", b)
		}
		if _, err := fw.Check(context.Background(), b); err == nil {
			t.Errorf("Check(%+v) accepted", b)
		}
	}
	if err := fw.Remove(context.Background(), "-j ACCEPT"); err == nil {
		t.Error("Remove of a bad bridge name accepted")
	}
	if len(tables.log) != 0 {
		t.Errorf("bad bridges reached iptables: %q", tables.log)
	}
}

func TestChainNameFits(t *testing.T) {
	for _, name := range []string{ChainName("abx-0123456789a"), OutputChainName("abx-0123456789a"), InputChainName("abx-0123456789a")} {
		if n := len(name); n > 28 {
			t.Errorf("chain name %s is %d chars, iptables allows 28", name, n)
		}
	}
}

// testFirewall is New with bridge netfilter switches of its own, both on,
// so that the tests do not depend on the machine's br_netfilter.
func testFirewall(t *testing.T, r Runner) *Firewall {
	t.Helper()
	fw := New(r)
	fw.bridgeNF = bridgeNFDir(t, "1", "1")
	return fw
}

// TestJumpsStayFirst: a rule put above abox's jump in a built-in chain
// (an ACCEPT, say) would let traffic skip the chain; Check reports it and
// Ensure puts the jump back on top. Another instance's jumps above ours
// are not a problem (each matches only its own bridge), so two instances
// do not fight over the top.
func TestJumpsStayFirst(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	other := "-A FORWARD -i abx-other -j ABOX-abx-other"
	tables.chains["iptables"]["FORWARD"] = append([]string{other}, tables.chains["iptables"]["FORWARD"]...)
	if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
		t.Errorf("Check with another instance's jump on top = %q, %v; want intact", st.Problems, err)
	}
	accept := "-A FORWARD -i " + br + " -j ACCEPT"
	tables.chains["iptables"]["FORWARD"] = append([]string{accept}, tables.chains["iptables"]["FORWARD"]...)
	st, err := fw.Check(ctx, bb)
	if err != nil || len(st.Problems) != 2 || !strings.Contains(st.Problems[0], "is not first in FORWARD") {
		t.Errorf("Check with an ACCEPT on top = %q, %v; want both FORWARD jumps reported", st.Problems, err)
	}
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	got := tables.chains["iptables"]["FORWARD"]
	if len(got) < 3 || !strings.HasSuffix(got[0], "-j "+fwdChain) || !strings.HasSuffix(got[1], "-j "+fwdChain) {
		t.Errorf("FORWARD after Ensure = %q, want abox's two jumps first", got)
	}
	n := 0
	for _, r := range got {
		if strings.HasSuffix(r, "-j "+fwdChain) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("FORWARD holds %d jumps to %s, want 2 (the old ones removed): %q", n, fwdChain, got)
	}
	if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
		t.Errorf("Check after repair = %q, %v", st.Problems, err)
	}
}
