//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/tetragon/api/v1/tetragon"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/paths"
)

// TestTetragonAgent runs the monitor end to end with the real Tetragon
// agent in a TCG guest: abox create --monitor-bundle installs it, and the
// host's monitor log must show the exec, file and net events the agent saw
// for what the test does in the guest. It also proves that the agent is
// Tetragon, not any program named tetragon that writes Tetragon's JSON: the
// unit's journal names the bundle's version, the kernel holds a kprobe on
// every function abox's policies hook (and drops them when the agent
// stops), and the events carry Tetragon's exec_id and parent_exec_id,
// linked as its process cache links them.
//
// It runs the bundle in ../shared/tetragon by default (tetragonBundle;
// ABOX_TETRAGON_BUNDLE overrides), and fails under CI=true without one:
//
//	sudo -E go test -p 1 -tags e2e -count=1 -timeout 30m -v -run TestTetragonAgent ./e2e/
func TestTetragonAgent(t *testing.T) {
	if os.Geteuid() != 0 {
		needVM(t, "the VM suite needs root (libvirt, namespaces, iptables)")
	}
	bundle, version := tetragonBundle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	const name = "tet"
	s := labSuite(t, ctx, "tet", name)
	files := paths.Layout{Root: s.home}.Instance(name)
	allow := filepath.Join(s.tmp, "allow.txt")
	os.WriteFile(allow, []byte("allowed.test\n"), 0o644)
	out := s.mustAbox("create", name, "--accel", "tcg", "--cpus", "2", "--memory", "2048", "--allowlist", allow,
		"--upstream", lab.Upstream, "--monitor-bundle", bundle)
	t.Logf("create:\n%s", out)
	st := s.state(name)
	if st.MonitorBundle == nil || !st.Monitor {
		t.Fatalf("state has no bundle: %+v", st)
	}
	// A first boot that does not wait: the guest side (forwarder and
	// Tetragon) must still come up, by the detached `abox monitor agent`.
	t0 := time.Now()
	out = s.mustAbox("start", "--no-wait", name)
	t.Logf("start --no-wait:\n%s", out)
	var setup guest.AgentSetup
	if err := poll(s.ctx, 12*time.Minute, func() bool {
		setup, _ = guest.ReadAgentSetup(files.MonitorAgent)
		if setup.At.IsZero() {
			time.Sleep(3 * time.Second)
			return false
		}
		return true
	}); err != nil || !setup.Installed || setup.Bundle != st.MonitorBundle.SHA256 || setup.Error != "" {
		b, _ := os.ReadFile(files.MonitorAgentLog)
		t.Fatalf("setup record %+v, %v\n%s", setup, err, b)
	}
	if b, _ := os.ReadFile(files.MonitorAgentLog); !strings.Contains(string(b), "tetragon installed and started") {
		t.Errorf("monitor-agent.log:\n%s", b)
	} else {
		t.Logf("monitor-agent.log:\n%s", b)
	}
	t.Logf("FIGURE tetragon start-to-installed %s (bundle copy, unpack and service start: %s)", time.Since(t0).Round(time.Second), time.Duration(setup.TookMS)*time.Millisecond)
	if got := s.mustGuest(t, name, "sudo cat "+cloudinit.TetragonMarker); got != st.MonitorBundle.SHA256 {
		t.Errorf("guest marker %q, want %s", got, st.MonitorBundle.SHA256)
	}

	// Tetragon is up once its API lists abox's policies.
	installed := time.Now()
	tetra := "sudo tetra --server-address unix://" + cloudinit.TetragonSocket + " "
	var policies string
	if err := poll(s.ctx, 10*time.Minute, func() bool {
		out, err := s.guest(name, tetra+"tracingpolicy list -o json")
		policies = out
		if err != nil || !policiesEnabled(out) {
			time.Sleep(3 * time.Second)
			return false
		}
		return true
	}); err != nil {
		j, _ := s.guest(name, "sudo journalctl -u "+cloudinit.TetragonUnit+" --no-pager | tail -40")
		t.Fatalf("tetragon never listed its policies: %v\n%s\njournal:\n%s", err, policies, j)
	}
	t.Logf("FIGURE tetragon: install done to both policies enabled (TCG, 2 vCPU): %s", time.Since(installed).Round(time.Second))
	t.Logf("tracing policies:\n%s", policies)
	if j, err := s.guest(name, "sudo journalctl -u "+cloudinit.TetragonUnit+" --no-pager -o cat | grep -iE 'level=(warn|error)|multi|fprobe|override|failed' | head -40"); err == nil {
		t.Logf("tetragon warnings and errors:\n%s", j)
	}
	if j, err := s.guest(name, "sudo journalctl -u "+cloudinit.TetragonUnit+" --no-pager -o short-monotonic | grep -E 'Starting tetragon|Listening for events|Loaded sensor|Loaded generic kprobe|policy' | head -30"); err == nil {
		t.Logf("tetragon start milestones:\n%s", j)
	}

	// It is Tetragon, the bundle's build: its version in the unit's journal.
	journal, err := s.guest(name, "sudo journalctl -b -u "+cloudinit.TetragonUnit+" --no-pager -o cat")
	if err != nil {
		t.Fatalf("the unit's journal: %v\n%s", err, journal)
	}
	if got, err := tetragonVersion(journal, version); err != nil {
		t.Errorf("%v; the unit's journal:\n%s", err, tail(journal, 40))
	} else {
		t.Logf("tetragon's journal: Starting tetragon, version %s", got)
	}
	// ... and a kprobe on every function abox's policies hook, in the
	// guest kernel's list of kprobes (Tetragon attaches BPF kprobes through
	// perf events, which show there, not in tracefs' kprobe_events).
	hooks := policyHooks(cloudinit.TetragonPolicies(st.User))
	if len(hooks) < 2 {
		t.Fatalf("abox's policies hook %q, want a function from each of the two", hooks)
	}
	kprobes := s.mustGuest(t, name, kprobeListCommand)
	t.Logf("the guest's kprobes:\n%s", kprobes)
	if missing := missingKprobes(kprobes, hooks); len(missing) > 0 {
		t.Errorf("the guest kernel has no kprobe on %q (the policies hook %q)", missing, hooks)
	}

	// What the agent should see: a command, a sensitive file, a connection.
	marker := fmt.Sprintf("abox-e2e-%d", time.Now().UnixNano())
	s.mustGuest(t, name, "/usr/bin/printf '%s\\n' "+marker+" >/dev/null; /usr/bin/id -u")
	s.mustGuest(t, name, "sudo cat /etc/shadow >/dev/null")
	proxy := fmt.Sprintf("http://%s:%d", st.Gateway, st.ProxyPort)
	s.mustGuest(t, name, "curl -sS -m 20 -o /dev/null -x "+proxy+" http://allowed.test/tetragon-connect || true")

	events := func(typ string) []monitor.Event {
		out, err := s.abox("monitor", "logs", "--json", "--type", typ, "-n", "100000", name)
		if err != nil {
			t.Fatalf("monitor logs: %v\n%s", err, out)
		}
		var evs []monitor.Event
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var ev monitor.Event
			if json.Unmarshal([]byte(line), &ev) == nil {
				evs = append(evs, ev)
			}
		}
		return evs
	}
	find := func(what string, typ string, ok func(monitor.Event) bool) monitor.Event {
		t.Helper()
		var found monitor.Event
		if err := poll(s.ctx, 2*time.Minute, func() bool {
			for _, ev := range events(typ) {
				if ok(ev) {
					found = ev
					return true
				}
			}
			time.Sleep(2 * time.Second)
			return false
		}); err != nil {
			t.Errorf("no %s event from the agent in the host's monitor log: %v", what, err)
		}
		return found
	}
	exec := find("exec of /usr/bin/id", "exec", func(ev monitor.Event) bool {
		return ev.Kind == "process_exec" && ev.Process != nil && ev.Process.Binary == "/usr/bin/id"
	})
	// printf's own exec (the shell's `bash -c` line holds the marker too).
	printf := find("exec of /usr/bin/printf with the marker argument", "exec", func(ev monitor.Event) bool {
		return ev.Kind == "process_exec" && ev.Process != nil && ev.Process.Binary == "/usr/bin/printf" && strings.Contains(ev.Process.Args, marker)
	})
	// sshd reads /etc/shadow too, at every login (PAM): the one wanted is
	// cat's.
	file := find("read of /etc/shadow by cat", "file", func(ev monitor.Event) bool {
		return ev.Path == "/etc/shadow" && ev.Op == "read" && ev.Policy == "abox-sensitive-files" && ev.Process != nil && ev.Process.Binary == "/usr/bin/cat"
	})
	net := find("connect to the proxy", "net", func(ev monitor.Event) bool {
		return ev.Function == "tcp_connect" && ev.Dst == st.Gateway.String() && ev.Port == uint32(st.ProxyPort)
	})
	for _, ev := range []monitor.Event{exec, printf, file, net} {
		b, _ := json.Marshal(ev)
		t.Logf("event: %s", b)
	}
	if net.Process == nil || net.Process.Binary != "/usr/bin/curl" {
		t.Errorf("the connect is not attributed to /usr/bin/curl: %+v", net.Process)
	}
	if exec.Process == nil || exec.Process.UID == nil || *exec.Process.UID != 1000 || exec.Parent == nil {
		t.Errorf("the exec event lacks its uid or parent: %+v", exec)
	}

	// Tetragon's exec_id and parent_exec_id, in the events it exported for
	// printf and its shell: ids that name the process (node:ktime:pid), and
	// the parent's id that of the shell's own exec event.
	raw, err := s.guest(name, "sudo grep -F -- "+marker+" "+cloudinit.MonitorExport)
	if err != nil {
		t.Fatalf("the guest's export file: %v\n%s", err, raw)
	}
	if err := execLinks(raw, marker, printf); err != nil {
		t.Errorf("%v; the export's lines with the marker:\n%s", err, raw)
	}

	ms := s.mustAbox("monitor", "status", name)
	t.Logf("monitor status:\n%s", ms)
	for _, want := range []string{"tetragon running", "sha256 " + st.MonitorBundle.SHA256, "tetragon installed and started"} {
		if !strings.Contains(ms, want) {
			t.Errorf("monitor status lacks %q", want)
		}
	}
	var js monitorStatus
	if out, err := s.abox("monitor", "status", "--json", name); err == nil && json.Unmarshal([]byte(out), &js) == nil {
		t.Logf("FIGURE tetragon events seen: %d (%v), dropped rate %d invalid %d oversize %d",
			js.Monitor.Events, js.Monitor.ByType, js.Monitor.DroppedRate, js.Monitor.DroppedInvalid, js.Monitor.DroppedOversize)
	}

	if rss, err := s.guest(name, "ps -o rss= -C tetragon; free -m | sed -n 2p"); err == nil {
		t.Logf("FIGURE tetragon resident KiB, then the guest's memory (MiB total used free ...): %s", strings.Join(strings.Fields(rss), " "))
	}

	// The kprobes are the agent's: they go when it stops (the next boot
	// starts it again).
	s.mustGuest(t, name, "sudo systemctl stop "+cloudinit.TetragonUnit)
	var left string
	if err := poll(s.ctx, 2*time.Minute, func() bool {
		out, err := s.guest(name, kprobeListCommand)
		left = out
		if err != nil || len(missingKprobes(out, hooks)) < len(hooks) {
			time.Sleep(2 * time.Second)
			return false
		}
		return true
	}); err != nil {
		t.Errorf("with tetragon stopped, the guest still has kprobes on what the policies hook (%q):\n%s", hooks, left)
	} else {
		t.Logf("with tetragon stopped, the guest's kprobes:\n%s", left)
	}

	// The agent comes back by itself on the next boot, without a reinstall.
	t.Run("restart keeps the agent", func(t *testing.T) {
		s.mustAbox("stop", name)
		t1 := time.Now()
		out := s.mustAbox("start", name)
		if strings.Contains(out, "installing tetragon") {
			t.Errorf("the second start installed the bundle again:\n%s", out)
		}
		if err := poll(s.ctx, 10*time.Minute, func() bool {
			out, err := s.guest(name, tetra+"tracingpolicy list -o json")
			if err != nil || !policiesEnabled(out) {
				time.Sleep(3 * time.Second)
				return false
			}
			return true
		}); err != nil {
			t.Fatalf("tetragon not back after a restart: %v", err)
		}
		t.Logf("FIGURE tetragon second boot: start to both policies enabled %s", time.Since(t1).Round(time.Second))
	})
}

// policiesEnabled: `tetra tracingpolicy list -o json` lists both of abox's
// policies enabled (they are listed first, and enabled once their programs
// are loaded).
func policiesEnabled(list string) bool {
	var l struct {
		Policies []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		} `json:"policies"`
	}
	if json.Unmarshal([]byte(list), &l) != nil {
		return false
	}
	enabled := map[string]bool{}
	for _, p := range l.Policies {
		enabled[p.Name] = p.State == "TP_STATE_ENABLED"
	}
	return enabled["abox-connects"] && enabled["abox-sensitive-files"]
}

// tetragonVersion is the version in the journal's "Starting tetragon"
// line (Tetragon logs its build's version there), which must be want, or
// any release-like version when want is "".
func tetragonVersion(journal, want string) (string, error) {
	var got string
	for _, l := range strings.Split(journal, "\n") {
		if m := startingRE.FindStringSubmatch(l); m != nil {
			got = m[1]
		}
	}
	switch {
	case got == "":
		return "", errors.New(`no "Starting tetragon" line with a version in the unit's journal`)
	case want != "" && got != want:
		return got, fmt.Errorf("tetragon says it is version %s, want %s", got, want)
	case want == "" && !releaseRE.MatchString(got):
		return got, fmt.Errorf("tetragon says it is version %q, not a release's", got)
	}
	return got, nil
}

var (
	startingRE = regexp.MustCompile(`msg="?Starting tetragon"?.*\bversion="?([^"\s]+)`)
	releaseRE  = regexp.MustCompile(`^v\d+\.\d+`)
	callRE     = regexp.MustCompile(`(?m)^\s*- call: "([^"]+)"`)
)

// policyHooks are the kernel functions the policies' kprobes hook.
func policyHooks(policies map[string]string) []string {
	var calls []string
	for _, p := range policies {
		for _, m := range callRE.FindAllStringSubmatch(p, -1) {
			calls = append(calls, m[1])
		}
	}
	slices.Sort(calls)
	return calls
}

// kprobeListCommand prints the guest kernel's kprobes: debugfs' list of
// every registered kprobe (BPF kprobes made through perf events show
// there), then tracefs' kprobe_events (kprobes made through tracefs).
const kprobeListCommand = `sudo sh -c 'mountpoint -q /sys/kernel/debug || mount -t debugfs none /sys/kernel/debug; cat /sys/kernel/debug/kprobes/list; for f in /sys/kernel/tracing/kprobe_events /sys/kernel/debug/tracing/kprobe_events; do [ -r $f ] && cat $f; done; true'`

// missingKprobes are the functions of want that no kprobe in list hooks.
// A line of debugfs' list is "ADDR k FUNC+OFF [FLAGS]", one of
// kprobe_events "p:GROUP/EVENT FUNC+OFF ARGS".
func missingKprobes(list string, want []string) []string {
	have := map[string]bool{}
	for _, l := range strings.Split(list, "\n") {
		f := strings.Fields(l)
		var sym string
		switch {
		case len(f) >= 3 && (f[1] == "k" || f[1] == "r"):
			sym = f[2]
		case len(f) >= 2 && (strings.HasPrefix(f[0], "p:") || strings.HasPrefix(f[0], "r:")):
			sym = f[1]
		default:
			continue
		}
		sym, _, _ = strings.Cut(sym, "+")
		have[sym] = true
	}
	var missing []string
	for _, w := range want {
		if !have[w] {
			missing = append(missing, w)
		}
	}
	return missing
}

// execLinks checks Tetragon's own fields in the events it exported for
// printf (host, the host's event for it): the exec event has an exec_id
// that encodes its node and pid ("NODE:KTIME:PID", base64) and a
// parent_exec_id that is its parent's exec_id, and an exec event for the
// parent (the shell whose command line holds the marker) has that id.
func execLinks(raw, marker string, host monitor.Event) error {
	execs := map[string]*tetragon.ProcessExec{}
	var pf *tetragon.ProcessExec
	var pfLine, node string
	for _, l := range strings.Split(strings.TrimSpace(raw), "\n") {
		var r tetragon.GetEventsResponse
		if (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal([]byte(l), &r) != nil {
			continue
		}
		e := r.GetProcessExec()
		if e == nil {
			continue
		}
		execs[e.GetProcess().GetExecId()] = e
		if e.GetProcess().GetBinary() == "/usr/bin/printf" && strings.Contains(e.GetProcess().GetArguments(), marker) {
			pf, pfLine, node = e, l, r.GetNodeName()
		}
	}
	if pf == nil {
		return errors.New("no process_exec of /usr/bin/printf with the marker in the guest's export")
	}
	p := pf.GetProcess()
	// In the export's own field names, as Tetragon writes them.
	var named struct {
		ProcessExec struct {
			Process struct {
				ExecID       string `json:"exec_id"`
				ParentExecID string `json:"parent_exec_id"`
			} `json:"process"`
		} `json:"process_exec"`
	}
	if err := json.Unmarshal([]byte(pfLine), &named); err != nil {
		return fmt.Errorf("printf's exec event: %v", err)
	}
	if n := named.ProcessExec.Process; n.ExecID == "" || n.ExecID != p.GetExecId() || n.ParentExecID == "" || n.ParentExecID != p.GetParentExecId() {
		return fmt.Errorf("printf's exec event has no exec_id and parent_exec_id fields (%+v)", n)
	}
	if err := execIDNames(p.GetExecId(), node, p.GetPid().GetValue()); err != nil {
		return fmt.Errorf("printf's exec_id: %w", err)
	}
	if host.Process == nil || host.Process.PID != p.GetPid().GetValue() {
		return fmt.Errorf("the host's event for printf is of pid %+v, the export's of %d", host.Process, p.GetPid().GetValue())
	}
	par := pf.GetParent()
	if p.GetParentExecId() == "" || p.GetParentExecId() != par.GetExecId() {
		return fmt.Errorf("printf's parent_exec_id %q is not its parent's exec_id %q", p.GetParentExecId(), par.GetExecId())
	}
	if err := execIDNames(par.GetExecId(), node, par.GetPid().GetValue()); err != nil {
		return fmt.Errorf("the parent's exec_id: %w", err)
	}
	sh := execs[p.GetParentExecId()]
	if sh == nil || !strings.Contains(sh.GetProcess().GetArguments(), marker) || sh.GetProcess().GetPid().GetValue() != par.GetPid().GetValue() {
		return fmt.Errorf("no exec event of the shell (pid %d, its command line with the marker) has printf's parent_exec_id %q", par.GetPid().GetValue(), p.GetParentExecId())
	}
	return nil
}

// execIDNames checks that id is Tetragon's exec id of pid on node:
// base64 of "NODE:KTIME:PID".
func execIDNames(id, node string, pid uint32) error {
	b, err := base64.StdEncoding.DecodeString(id)
	if err != nil {
		return fmt.Errorf("%q is not base64: %v", id, err)
	}
	f := strings.Split(string(b), ":")
	if len(f) != 3 || f[0] != node || f[2] != strconv.FormatUint(uint64(pid), 10) {
		return fmt.Errorf("%q (%q) is not %s:KTIME:%d", id, b, node, pid)
	}
	if _, err := strconv.ParseUint(f[1], 10, 64); err != nil {
		return fmt.Errorf("%q (%q): no ktime", id, b)
	}
	return nil
}
