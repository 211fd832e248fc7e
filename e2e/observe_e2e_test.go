//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// TestObserve boots one guest and proves the observation tools on it: a tap
// captures its HTTPS through the proxy and tshark decrypts it with the key
// log the proxy wrote while the tap ran.
//
//	go test -tags e2e -run TestObserve -v -timeout 30m ./e2e/
func TestObserve(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the VM suite needs root (libvirt, namespaces, iptables)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	const name = "obs"
	s := labSuite(t, ctx, "obs", name)
	l := s.lab
	allow := filepath.Join(s.tmp, "allow.txt")
	os.WriteFile(allow, []byte("allowed.test\n*.allowed.test\nprivate.test\n"), 0o644)
	s.mustAbox("create", name, "--accel", "tcg", "--cpus", "1", "--memory", "1024", "--allowlist", allow,
		"--upstream", lab.Upstream, "--upstream-ca", l.OriginCA, "--monitor")
	st := s.state(name)
	t0 := time.Now()
	s.mustAbox("start", name)
	if err := s.waitSSH(name, 12*time.Minute); err != nil {
		t.Fatal(err)
	}
	s.guest(name, "cloud-init status --wait >/dev/null 2>&1; true")
	t.Logf("FIGURE observe guest start-to-ssh-ready: %s", time.Since(t0).Round(time.Second))
	files := paths.Layout{Root: s.home}.Instance(name)
	proxy := fmt.Sprintf("http://%s:%d", st.Gateway, st.ProxyPort)

	t.Run("tap captures HTTPS that the key log decrypts", func(t *testing.T) {
		pcap := filepath.Join(s.tmp, "tap.pcap")
		tctx, tcancel := context.WithTimeout(s.ctx, 3*time.Minute)
		defer tcancel()
		cmd := s.lab.AboxCmd(tctx, "tap", name, "-o", pcap)
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var said strings.Builder
		ready := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(stderr)
			closed := false
			for sc.Scan() {
				said.WriteString(sc.Text() + "\n")
				if !closed && strings.Contains(sc.Text(), "tshark -o tls.keylog_file:") {
					closed = true
					close(ready)
				}
			}
			io.Copy(io.Discard, stderr)
		}()
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("abox tap did not start:\n%s", said.String())
		}
		if out, err := s.abox("http", "status", "--json", name); err != nil || !strings.Contains(out, `"keylog": true`) {
			t.Errorf("key log not on while the tap runs (%v):\n%s", err, out)
		}
		// Over abox ssh, which the tap must leave out by default.
		if out := s.mustGuest(t, name, "curl -sS -m 30 -x "+proxy+" https://www.allowed.test/tap-secret-path"); !strings.Contains(out, "GET /tap-secret-path") {
			t.Fatalf("guest request = %q", out)
		}
		time.Sleep(time.Second)
		cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			t.Fatalf("abox tap after Ctrl-C: %v\n%s", err, said.String())
		}
		if out, _ := s.abox("http", "status", "--json", name); !strings.Contains(out, `"keylog": false`) {
			t.Errorf("key log still on after the tap ended:\n%s", out)
		}
		fi, err := os.Stat(files.KeyLog)
		if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() == 0 {
			t.Fatalf("key log %s: %v (mode %v, size %d)", files.KeyLog, err, fi.Mode(), fi.Size())
		}
		if !strings.Contains(said.String(), files.KeyLog) {
			t.Errorf("tap did not say where the keys are:\n%s", said.String())
		}
		// curl speaks HTTP/2 to the proxy's interception when ALPN offers
		// it, so the inner request is an http2 HEADERS frame.
		decode := func(keylog string, filter string, fields ...string) string {
			args := []string{"-r", pcap, "-d", fmt.Sprintf("tcp.port==%d,http", st.ProxyPort), "-Y", filter, "-T", "fields"}
			for _, f := range fields {
				args = append(args, "-e", f)
			}
			if keylog != "" {
				args = append([]string{"-o", "tls.keylog_file:" + keylog}, args...)
			}
			var stderr strings.Builder
			c := exec.Command("tshark", args...)
			c.Stderr = &stderr
			out, err := c.Output()
			if err != nil {
				t.Fatalf("tshark %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
			}
			return string(out)
		}
		if got := decode("", "http.request || http2.headers.path", "http.request.uri", "http2.headers.path"); strings.Contains(got, "/tap-secret-path") {
			t.Fatalf("the inner path is readable without the keys: %s", got)
		}
		if got := decode(files.KeyLog, "http.request || http2.headers.path", "http.request.uri", "http2.headers.path"); !strings.Contains(got, "/tap-secret-path") {
			t.Errorf("decrypted capture lacks the guest's request; tshark printed:\n%s", got)
		}
		if got := decode("", "tcp.port==22", "frame.number"); strings.TrimSpace(got) != "" {
			t.Errorf("the capture holds SSH packets (frames %s) though --include-ssh was not given", strings.Join(strings.Fields(got), ","))
		}
	})

	// doctor runs abox doctor --json and returns its report and whether it
	// exited non-zero.
	// hostOnly skips the guest probes: the layers broken below are seen
	// from the host, and the probes take most of doctor's time under TCG.
	doctorRun := func(t *testing.T, hostOnly bool) (doctorReport, bool) {
		t.Helper()
		t0 := time.Now()
		args := []string{"doctor", "--json", "--probe-ip", lab.OriginIP, "--probe-resolver", lab.OriginIP}
		if hostOnly {
			args = append(args, "--no-guest")
		}
		cmd := s.lab.AboxCmd(s.ctx, append(args, name)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var r doctorReport
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			t.Fatalf("doctor output is not a report (%v, exit %v):\n%s%s", jerr, err, out, stderr.String())
		}
		t.Logf("FIGURE doctor (host only %v): %s wall, %d ms inside, %d checks, exit error %v", hostOnly, time.Since(t0).Round(time.Millisecond), r.TookMS, len(r.Checks), err)
		return r, err != nil
	}
	doctor := func(t *testing.T) (doctorReport, bool) { return doctorRun(t, false) }
	failedLayers := func(r doctorReport) []string {
		var out []string
		for _, c := range r.Checks {
			if c.Status == "fail" {
				out = append(out, c.Layer+": "+c.Name+": "+c.Detail)
			}
		}
		return out
	}
	healthy := func(t *testing.T) {
		t.Helper()
		r, failed := doctorRun(t, true)
		if failed || len(failedLayers(r)) > 0 {
			t.Fatalf("doctor fails on a healthy instance:\n%s", strings.Join(failedLayers(r), "\n"))
		}
	}
	mustFailOn := func(t *testing.T, layer, check string) {
		t.Helper()
		r, failed := doctorRun(t, true)
		if !failed {
			t.Errorf("doctor exited 0 with the %s layer broken", layer)
		}
		for _, c := range r.Checks {
			if c.Layer == layer && c.Name == check && c.Status == "fail" {
				if c.Fix == "" {
					t.Errorf("%s/%s failed without a fix", layer, check)
				}
				return
			}
		}
		t.Errorf("doctor did not name %s/%s; failures:\n%s", layer, check, strings.Join(failedLayers(r), "\n"))
	}

	t.Run("refusals reach the refusal streams", func(t *testing.T) { refusalStreamOnGuest(t, s, name, st) })

	t.Run("doctor passes on a healthy instance", func(t *testing.T) {
		r, _ := doctor(t)
		guest := 0
		for _, c := range r.Checks {
			if c.Layer == "guest" && c.Status == "pass" {
				guest++
			}
		}
		if guest < 10 {
			t.Errorf("only %d guest probes passed: %+v", guest, r.Checks)
		}
		// Nothing on a fresh instance deserves a warning either: the
		// guest's tools are set for the proxy by the seed.
		for _, c := range r.Checks {
			if c.Status == "warn" {
				t.Errorf("warning on a healthy instance: %s/%s: %s", c.Layer, c.Name, c.Detail)
			}
		}
		if f := failedLayers(r); len(f) > 0 {
			t.Errorf("doctor fails on a healthy instance:\n%s", strings.Join(f, "\n"))
		}
	})
	t.Run("doctor names a detached nwfilter", func(t *testing.T) {
		out, err := s.env.Virsh(s.ctx, "domiflist", "abox-"+name)
		if err != nil {
			t.Fatal(err)
		}
		dev := ""
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "vnet") {
				dev = f
			}
		}
		if dev == "" {
			t.Fatalf("no vnet device in:\n%s", out)
		}
		binding, err := s.env.Virsh(s.ctx, "nwfilter-binding-dumpxml", dev)
		if err != nil {
			t.Fatal(err)
		}
		bfile := filepath.Join(s.tmp, "binding.xml")
		os.WriteFile(bfile, []byte(binding), 0o644)
		if _, err := s.env.Virsh(s.ctx, "nwfilter-binding-delete", dev); err != nil {
			t.Fatal(err)
		}
		mustFailOn(t, "nwfilter", "bound on the live interface")
		if out, err := s.env.Virsh(s.ctx, "nwfilter-binding-create", bfile); err != nil {
			t.Fatalf("restoring the binding: %v %s", err, out)
		}
		healthy(t)
	})
	t.Run("doctor names an edited nwfilter", func(t *testing.T) {
		s.openNWFilter(t, name)
		mustFailOn(t, "nwfilter", "filter defined")
		s.restoreNWFilter(t, name)
		healthy(t)
	})
	t.Run("doctor names a removed host chain", func(t *testing.T) {
		jump := []string{"-w", "10", "-t", hostfw.Table, "INPUT", "-i", st.Bridge, "-j", hostfw.InputChainName(st.Bridge)}
		del := append([]string{"-w", "10", "-t", hostfw.Table, "-D"}, jump[4:]...)
		if out, err := s.inNS(10*time.Second, "iptables", del...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		mustFailOn(t, "hostfw", "host chains present and first")
		fw := hostfw.New(nsRunner{s})
		if err := fw.Ensure(s.ctx, instance.FirewallBridge(st)); err != nil {
			t.Fatal(err)
		}
		healthy(t)
	})
	t.Run("doctor names a foreign rule ahead of the host chains", func(t *testing.T) {
		rule := []string{"-i", st.Bridge, "-p", "tcp", "--dport", "8081", "-j", "ACCEPT"}
		if out, err := s.inNS(10*time.Second, "iptables", append([]string{"-w", "10", "-t", hostfw.Table, "-I", "INPUT", "1"}, rule...)...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		mustFailOn(t, "hostfw", "host chains present and first")
		if out, err := s.inNS(10*time.Second, "iptables", append([]string{"-w", "10", "-t", hostfw.Table, "-D", "INPUT"}, rule...)...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		healthy(t)
	})
	t.Run("doctor names a killed daemon", func(t *testing.T) {
		sup := s.daemonPID(t, name)
		syscall.Kill(-sup, syscall.SIGKILL)
		poll(s.ctx, 10*time.Second, func() bool { return syscall.Kill(sup, 0) != nil })
		mustFailOn(t, "daemon", "api answering")
		s.mustAbox("start", name)
		healthy(t)
	})

	// The monitor. The guest has no Tetragon (it cannot be built here, see
	// docs/monitor.md); tetragon-emitter stands in for it: it does real
	// things in the guest and appends Tetragon-JSON events for them to
	// Tetragon's export file, which the real forwarder carries over the
	// real virtio-serial channel.
	mstatus := func(t *testing.T) monitorStatus {
		t.Helper()
		out, err := s.abox("monitor", "status", "--json", name)
		var ms monitorStatus
		if err != nil || json.Unmarshal([]byte(out), &ms) != nil {
			t.Fatalf("monitor status: %v\n%s", err, out)
		}
		return ms
	}
	waitFor := func(t *testing.T, what string, timeout time.Duration, f func() bool) {
		t.Helper()
		if err := poll(s.ctx, timeout, f); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	t.Run("monitor channel connects and the forwarder beats", func(t *testing.T) {
		waitFor(t, "heartbeat", 90*time.Second, func() bool {
			ms := mstatus(t)
			return ms.Running && ms.Monitor.Connected && !ms.Monitor.LastHeartbeat.IsZero()
		})
		fi, err := os.Stat(files.RunDir)
		if err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("the channel socket's directory %s is open to others (%v, %v)", files.RunDir, fi.Mode(), err)
		}
	})
	emitter := filepath.Join(s.tmp, "tetragon-emitter")
	build := exec.CommandContext(s.ctx, "go", "build", "-ldflags", "-s -w", "-o", emitter, "./tools/tetragon-emitter")
	build.Dir, build.Env = "..", append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the emitter: %v\n%s", err, out)
	}
	bin, err := os.Open(emitter)
	if err != nil {
		t.Fatal(err)
	}
	up := s.lab.AboxCmd(s.ctx, "ssh", name, "--", "cat > /tmp/tetragon-emitter && chmod 755 /tmp/tetragon-emitter")
	up.Stdin = bin
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("copying the emitter into the guest: %v\n%s", err, out)
	}
	bin.Close()
	emit := func(t *testing.T, args string) {
		t.Helper()
		s.mustGuest(t, name, "sudo /tmp/tetragon-emitter "+args)
	}
	logs := func(t *testing.T, typ string) string {
		t.Helper()
		out, err := s.abox("monitor", "logs", "--json", "--type", typ, "-n", "1000", name)
		if err != nil {
			t.Fatalf("monitor logs: %v\n%s", err, out)
		}
		return out
	}
	t.Run("monitor log shows the guest's exec, file and net events", func(t *testing.T) {
		emit(t, "exec -- /usr/bin/id -u")
		emit(t, "read /etc/shadow")
		emit(t, fmt.Sprintf("connect %s:%d", st.Gateway, st.ProxyPort))
		// Each event travels on its own (export file, forwarder, channel).
		waitFor(t, "exec event", 30*time.Second, func() bool { return strings.Contains(logs(t, "exec"), `"binary":"/usr/bin/id"`) })
		waitFor(t, "file event", 30*time.Second, func() bool {
			out := logs(t, "file")
			return strings.Contains(out, `"path":"/etc/shadow"`) && strings.Contains(out, `"op":"read"`)
		})
		waitFor(t, "net event", 30*time.Second, func() bool {
			out := logs(t, "net")
			return strings.Contains(out, fmt.Sprintf(`"dst":"%s"`, st.Gateway)) && strings.Contains(out, fmt.Sprintf(`"port":%d`, st.ProxyPort))
		})
		if out := logs(t, "exec"); strings.Contains(out, `"type":"file"`) {
			t.Errorf("--type exec printed other types:\n%s", out)
		}
	})
	t.Run("monitor: hostile lines are dropped and nothing reaches the terminal raw", func(t *testing.T) {
		before := mstatus(t).Monitor
		// Guest root bypasses the forwarder (which would drop the
		// oversized line itself) and writes into the port directly.
		s.mustGuest(t, name, "sudo systemctl stop abox-monitor-forwarder.service && sudo /tmp/tetragon-emitter --out "+cloudinit.MonitorPort+" hostile; rc=$?; sudo systemctl start abox-monitor-forwarder.service; exit $rc")
		waitFor(t, "drops counted", 30*time.Second, func() bool {
			m := mstatus(t).Monitor
			return m.DroppedOversize > before.DroppedOversize && m.DroppedInvalid > before.DroppedInvalid
		})
		out, err := s.abox("monitor", "logs", name)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "evil") {
			t.Fatalf("the hostile exec event is missing:\n%s", out)
		}
		for _, bad := range []string{"\x1b", "\x07", "\u009b", "\u202e"} {
			if strings.Contains(out, bad) {
				t.Errorf("monitor logs printed %q raw", bad)
			}
		}
	})
	t.Run("monitor: a flood is bounded and the instance is unaffected", func(t *testing.T) {
		before := mstatus(t).Monitor
		emit(t, "flood 30000")
		waitFor(t, "flood dropped", 60*time.Second, func() bool { return mstatus(t).Monitor.DroppedRate > before.DroppedRate })
		after := mstatus(t).Monitor
		t.Logf("FIGURE monitor flood: 30000 forged events, %d accepted, %d dropped by rate", after.Events-before.Events, after.DroppedRate-before.DroppedRate)
		if after.Events-before.Events >= 30000 {
			t.Errorf("the flood was not bounded: %d events accepted", after.Events-before.Events)
		}
		if out := s.mustGuest(t, name, "dig +short +tries=2 +time=3 @"+st.Gateway.String()+" allowed.test"); !strings.Contains(out, lab.OriginIP) {
			t.Errorf("DNS after the flood = %q", out)
		}
	})
	t.Run("monitor shows a silent agent, and its death leaves the instance running", func(t *testing.T) {
		s.mustGuest(t, name, "sudo systemctl stop abox-monitor-forwarder.service")
		waitFor(t, "agent silent", 60*time.Second, func() bool { return mstatus(t).AgentSilent })
		out, _ := s.abox("monitor", "status", name)
		if !strings.Contains(out, "silent since") {
			t.Errorf("monitor status does not say silent:\n%s", out)
		}
		s.mustGuest(t, name, "sudo systemctl start abox-monitor-forwarder.service")
		waitFor(t, "agent back", 60*time.Second, func() bool { return !mstatus(t).AgentSilent })
		// Kill the whole monitor (supervisor and child): the filters and
		// the guest carry on.
		b, err := os.ReadFile(files.MonitorPID)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		syscall.Kill(-pid, syscall.SIGKILL)
		waitFor(t, "monitor gone", 10*time.Second, func() bool { return !mstatus(t).Running })
		if out := s.mustGuest(t, name, "curl -sS -m 20 -x "+proxy+" http://allowed.test/after-monitor"); !strings.Contains(out, "GET /after-monitor") {
			t.Errorf("proxy after the monitor died = %q", out)
		}
		healthy(t)
		s.mustAbox("start", name) // brings the monitor back
		waitFor(t, "monitor back", 60*time.Second, func() bool { ms := mstatus(t); return ms.Running && ms.Monitor.Connected })
	})
}

// monitorStatus is abox monitor status --json.
type monitorStatus struct {
	Running     bool      `json:"running"`
	AgentSilent bool      `json:"agent_silent"`
	SilentSince time.Time `json:"silent_since"`
	Monitor     struct {
		Connected       bool              `json:"connected"`
		LastHeartbeat   time.Time         `json:"last_heartbeat"`
		Agent           string            `json:"agent"`
		Events          uint64            `json:"events"`
		ByType          map[string]uint64 `json:"by_type"`
		DroppedOversize uint64            `json:"dropped_oversize"`
		DroppedRate     uint64            `json:"dropped_rate"`
		DroppedInvalid  uint64            `json:"dropped_invalid"`
	} `json:"monitor"`
}

// doctorReport is abox doctor's JSON.
type doctorReport struct {
	Checks []struct {
		Layer, Name, Status, Detail, Fix string
	} `json:"checks"`
	TookMS int64 `json:"took_ms"`
}
