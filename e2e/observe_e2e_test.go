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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
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
	s := &suite{t: t, ctx: ctx, tmp: t.TempDir()}
	os.Chmod(s.tmp, 0o755)
	if _, err := (image.Builder{Run: image.ExecRunner{}}).BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), nil); err != nil {
		t.Fatalf("building the base image: %v", err)
	}
	l, err := lab.Start(ctx, "..", "obs", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	s.lab, s.env, s.home = l, l.Env, l.Home
	const name = "obs"
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		s.ctx = cctx
		if t.Failed() {
			for _, f := range []string{"daemon.log", "serial.log"} {
				if b, err := os.ReadFile(filepath.Join(s.home, "instances", name, "logs", f)); err == nil {
					t.Logf("%s:\n%s", f, tail(string(b), 30))
				}
			}
		}
		if out, err := s.abox("remove", "--force", name); err != nil && !strings.Contains(out, "no such instance") {
			t.Logf("remove: %v\n%s", err, out)
		}
		if err := l.Close(cctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	s.mustAbox("base", "build", "debian-12")
	allow := filepath.Join(s.tmp, "allow.txt")
	os.WriteFile(allow, []byte("allowed.test\n*.allowed.test\nprivate.test\n"), 0o644)
	s.mustAbox("create", name, "--accel", "tcg", "--cpus", "1", "--memory", "1024", "--allowlist", allow,
		"--upstream", lab.Upstream, "--upstream-ca", l.OriginCA)
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
	doctor := func(t *testing.T) (doctorReport, bool) {
		t.Helper()
		t0 := time.Now()
		cmd := s.lab.AboxCmd(s.ctx, "doctor", "--json", "--probe-ip", lab.OriginIP, "--probe-resolver", lab.OriginIP, name)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var r doctorReport
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			t.Fatalf("doctor output is not a report (%v, exit %v):\n%s%s", jerr, err, out, stderr.String())
		}
		t.Logf("FIGURE doctor: %s wall, %d ms inside, %d checks, exit error %v", time.Since(t0).Round(time.Millisecond), r.TookMS, len(r.Checks), err)
		return r, err != nil
	}
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
		r, failed := doctor(t)
		if failed || len(failedLayers(r)) > 0 {
			t.Fatalf("doctor fails on a healthy instance:\n%s", strings.Join(failedLayers(r), "\n"))
		}
	}
	mustFailOn := func(t *testing.T, layer, check string) {
		t.Helper()
		r, failed := doctor(t)
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
		healthy(t)
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
		if err := fw.Ensure(s.ctx, hostfw.Bridge{Name: st.Bridge, Gateway: st.Gateway, ProxyPort: st.ProxyPort}); err != nil {
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
}

// doctorReport is abox doctor's JSON.
type doctorReport struct {
	Checks []struct {
		Layer, Name, Status, Detail, Fix string
	} `json:"checks"`
	TookMS int64 `json:"took_ms"`
}
