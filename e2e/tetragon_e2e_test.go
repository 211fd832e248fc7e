//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/paths"
)

// TestTetragonAgent runs the monitor end to end with the real Tetragon
// agent in a TCG guest: abox create --monitor-bundle installs it, and the
// host's monitor log must show the exec, file and net events the agent saw
// for what the test does in the guest.
//
// It runs only when ABOX_TETRAGON_BUNDLE names a bundle (docs/monitor.md
// says how to build one from Tetragon's sources). CI's machines cannot
// build or download one, so there it is skipped, never failed:
//
//	ABOX_TETRAGON_BUNDLE=/work/cache/tetragon-bundle.tar.gz \
//	  go test -tags e2e -run TestTetragonAgent -v -timeout 30m ./e2e/
func TestTetragonAgent(t *testing.T) {
	bundle := os.Getenv("ABOX_TETRAGON_BUNDLE")
	if bundle == "" {
		t.Skip("ABOX_TETRAGON_BUNDLE is not set: no real Tetragon bundle to run (opt-in; CI has none)")
	}
	if os.Geteuid() != 0 {
		needVM(t, "the VM suite needs root (libvirt, namespaces, iptables)")
	}
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
	printf := find("exec with the marker argument", "exec", func(ev monitor.Event) bool {
		return ev.Process != nil && strings.Contains(ev.Process.Args, marker)
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
	if net.Process != nil && net.Process.Binary != "/usr/bin/curl" {
		t.Errorf("the connect is attributed to %s, want /usr/bin/curl", net.Process.Binary)
	}
	if exec.Process != nil && (exec.Process.UID == nil || *exec.Process.UID != 1000 || exec.Parent == nil) {
		t.Errorf("the exec event lacks its uid or parent: %+v", exec)
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
