//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// wf runs abox for the workflow test. Unlike lab.Abox (ip netns exec, a
// mount namespace of its own per call), it enters only the network
// namespace, so sshfs mounts land in the test's own mount namespace where
// the test can look at them and the next abox call can unmount them.
type wf struct {
	t   *testing.T
	ctx context.Context
	lab *lab.Lab
	dir string // the project directory holding abox.yaml
	// secret is the value of the secret abox.yaml binds (fileSecretName).
	secret string
}

func (w *wf) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	a := append([]string{"--net=/run/netns/" + w.lab.Env.Name, "--", name}, args...)
	c := exec.CommandContext(ctx, "nsenter", a...)
	c.Env = append(os.Environ(), paths.EnvHome+"="+w.lab.Home, "ABOX_LIBVIRT_SOCKET="+w.lab.Env.Socket)
	c.Dir = w.dir
	return c
}

func (w *wf) abox(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(w.ctx, 15*time.Minute)
	defer cancel()
	var out bytes.Buffer
	c := w.cmd(ctx, filepath.Join(w.lab.Bin, "abox"), args...)
	c.Stdout, c.Stderr = &out, &out
	err := c.Run()
	return out.String(), err
}

func (w *wf) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := w.abox(args...)
	if err != nil {
		t.Fatalf("abox %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (w *wf) guest(t *testing.T, command string) string {
	t.Helper()
	return strings.TrimSpace(w.must(t, "ssh", "wf", "--", command))
}

// inNS runs a host program in the test network namespace.
func (w *wf) inNS(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(w.ctx, timeout)
	defer cancel()
	out, err := w.cmd(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

// TestWorkflow drives one guest through what a user does every day:
// provisioning, files in and out, mounts and port forwards.
func TestWorkflow(t *testing.T) {
	if os.Geteuid() != 0 {
		needVM(t, "the VM suite needs root (libvirt, namespaces, iptables)")
	}
	if _, err := exec.LookPath("sshfs"); err != nil {
		t.Fatal("sshfs is not installed (scripts/host-deps.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	if _, err := (image.Builder{Run: image.ExecRunner{}}).BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), nil); err != nil {
		t.Fatalf("building the base image: %v", err)
	}
	l, err := lab.Start(ctx, "..", "wf", t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	w := &wf{t: t, ctx: ctx, lab: l, dir: t.TempDir()}
	os.Chmod(w.dir, 0o755)
	mnt := filepath.Join(t.TempDir(), "mnt")
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		w.ctx = cctx
		if t.Failed() {
			files := paths.Layout{Root: l.Home}.Instance("wf")
			for _, f := range []string{files.DaemonLog, files.SerialLog} {
				if b, err := os.ReadFile(f); err == nil {
					t.Logf("%s:\n%s", f, tail(string(b), 30))
				}
			}
		}
		w.abox("remove", "--force", "wf")
		w.abox("remove", "--force", "wf2")
		exec.Command("umount", "-l", mnt).Run()
		if err := l.Close(cctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	w.must(t, "base", "build", "debian-12")

	// init writes a starter that loads; the test then describes its own
	// sandbox (the lab's resolver and origin CA are widening settings).
	t.Run("init writes a starter abox.yaml", func(t *testing.T) {
		out := w.must(t, "init", "--preset", "github", "--name", "wf")
		b, err := os.ReadFile(filepath.Join(w.dir, "abox.yaml"))
		if err != nil || !strings.Contains(string(b), "  - github.com") || !strings.Contains(out, "wrote abox.yaml") {
			t.Fatalf("init: %v\n%s\n%s", err, out, b)
		}
		if out, err := w.abox("init"); err == nil {
			t.Errorf("init overwrote an existing file: %s", out)
		}
	})
	ca, err := os.ReadFile(l.OriginCA)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(w.dir, "lab-ca.pem"), string(ca), 0o644)
	writeFile(t, filepath.Join(w.dir, "setup", "etc", "abox-up", "marker"), "overlay from up\n", 0o644)
	writeFile(t, filepath.Join(w.dir, "setup.sh"), "#!/bin/sh\nset -e\necho \"setup proxy=$https_proxy\"\ncurl -sS -m 20 https://allowed.test/provisioned\necho\ncurl -sS -m 20 https://blocked.test/ 2>&1 || true\ntouch /root/provisioned\n", 0o755)
	yaml := func(cpus int, extra string) string {
		return fmt.Sprintf(`version: 1
name: wf
accel: tcg
cpus: %d
memory: 1024
allowlist: [allowed.test, www.allowed.test, api.test]
dns:
  upstreams: ["%s"]
upstream_ca: lab-ca.pem
provision:
  overlay: setup
  scripts: [setup.sh]
%s%s`, cpus, lab.Upstream, workflowSecretYAML, extra)
	}
	writeFile(t, filepath.Join(w.dir, "abox.yaml"), yaml(1, ""), 0o644)

	t.Run("an untrusted widening abox.yaml is refused and makes nothing", func(t *testing.T) {
		out, err := w.abox("up")
		if err == nil || !strings.Contains(out, "not trusted") || !strings.Contains(out, "dns.upstreams") || !strings.Contains(out, "upstream_ca") || !strings.Contains(out, "abox trust") {
			t.Fatalf("untrusted up: %v\n%s", err, out)
		}
		if _, err := os.Stat(paths.Layout{Root: l.Home}.InstanceDir("wf")); err == nil {
			t.Errorf("the refused up left an instance directory")
		}
	})
	w.must(t, "trust")
	w.secret = w.storeWorkflowSecret(t)
	var upOut string
	t.Run("up creates, boots and provisions, reporting what the filters blocked", func(t *testing.T) {
		t0 := time.Now()
		upOut = w.must(t, "up")
		t.Logf("FIGURE up (create, first boot under TCG, provision): %s", time.Since(t0).Round(time.Second))
		for _, want := range []string{"setup proxy=http://", "GET /provisioned host=allowed.test", "CONNECT tunnel failed, response 403",
			"blocked during provisioning: http blocked.test:443 (not_allowlisted); to allow it add to " + filepath.Join(w.dir, "abox.yaml") + ": allowlist: [blocked.test]"} {
			if !strings.Contains(upOut, want) {
				t.Errorf("up output lacks %q:\n%s", want, upOut)
			}
		}
		if got := w.guest(t, "cat /etc/abox-up/marker; sudo test -e /root/provisioned && echo provisioned"); got != "overlay from up\nprovisioned" {
			t.Errorf("in the guest: %q", got)
		}
	})
	gw := strings.TrimSpace(w.guest(t, "ip -4 route show default | awk '{print $3}'"))
	t.Run("a secret abox.yaml binds is in the guest's environment from the first boot and opens its API", func(t *testing.T) {
		w.secretFromFileChecks(t, w.secret)
	})

	t.Run("guest tools get the proxy and the CA in SSH sessions and login shells", func(t *testing.T) {
		port := strconv.Itoa(int(instance.DefaultProxyPort))
		want := "-Dhttp.proxyHost=" + gw + " -Dhttp.proxyPort=" + port + " -Dhttps.proxyHost=" + gw + " -Dhttps.proxyPort=" + port + "|/etc/ssl/certs/ca-certificates.crt|http://" + gw + ":" + port
		for _, cmd := range []string{`echo "$JAVA_TOOL_OPTIONS|$CARGO_HTTP_CAINFO|$https_proxy"`, `bash -lc 'echo "$JAVA_TOOL_OPTIONS|$CARGO_HTTP_CAINFO|$https_proxy"'`} {
			if got := w.guest(t, cmd); got != want {
				t.Errorf("%s = %q, want %q", cmd, got, want)
			}
		}
	})

	t.Run("provision runs the overlay and scripts as root with the proxy, stopping at the first failure", func(t *testing.T) {
		writeFile(t, filepath.Join(w.dir, "overlay", "etc", "abox-test", "hello.txt"), "from the overlay\n", 0o644)
		writeFile(t, filepath.Join(w.dir, "one.sh"), "#!/bin/sh\necho \"one uid=$(id -u) proxy=$https_proxy pwd=$(pwd)\"\ncat /etc/abox-test/hello.txt\necho err-line >&2\n", 0o755)
		writeFile(t, filepath.Join(w.dir, "two.sh"), "echo two-ran; exit 7\n", 0o644) // no shebang: run by sh
		writeFile(t, filepath.Join(w.dir, "three.sh"), "#!/bin/sh\ntouch /root/three-ran\n", 0o755)
		out, err := w.abox("provision", "wf", "--overlay", "overlay", "-s", "one.sh", "-s", "two.sh", "-s", "three.sh")
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 7 {
			t.Fatalf("provision exit = %v, want status 7 of two.sh\n%s", err, out)
		}
		for _, want := range []string{"one uid=0 proxy=http://" + gw + ":" + strconv.Itoa(int(instance.DefaultProxyPort)) + " pwd=/", "from the overlay", "err-line", "two-ran", "two.sh exited with status 7"} {
			if !strings.Contains(out, want) {
				t.Errorf("provision output lacks %q:\n%s", want, out)
			}
		}
		if got := w.guest(t, "sudo test -e /root/three-ran && echo ran || echo not-run"); got != "not-run" {
			t.Errorf("the script after the failing one ran: %s", got)
		}
		if got := w.guest(t, "stat -c '%U %a' /etc/abox-test/hello.txt"); got != "root 644" {
			t.Errorf("overlay file = %q, want root 644", got)
		}
		if got := w.guest(t, "ls -d /tmp/abox-provision.* 2>/dev/null | wc -l"); got != "0" {
			t.Errorf("provisioning left %s script directories in /tmp", got)
		}
		os.Symlink("/etc/shadow", filepath.Join(w.dir, "overlay", "evil"))
		if out, err := w.abox("provision", "wf", "--overlay", "overlay"); err == nil || !strings.Contains(out, "symbolic link") {
			t.Errorf("an overlay with a symlink to a host file was copied: %v\n%s", err, out)
		}
	})

	t.Run("scp both ways, files and trees", func(t *testing.T) {
		writeFile(t, filepath.Join(w.dir, "in.txt"), "host to guest\n", 0o644)
		writeFile(t, filepath.Join(w.dir, "tree", "sub", "f.txt"), "tree file\n", 0o644)
		w.must(t, "scp", "in.txt", "wf:in.txt")
		w.must(t, "scp", "-r", "tree", "wf:")
		if got := w.guest(t, "cat in.txt tree/sub/f.txt"); got != "host to guest\ntree file" {
			t.Errorf("in the guest: %q", got)
		}
		w.guest(t, "mkdir -p out/deep && echo guest to host > out/deep/g.txt")
		w.must(t, "scp", "-r", "wf:out", "back")
		w.must(t, "scp", "wf:in.txt", "./in-back.txt")
		if b, err := os.ReadFile(filepath.Join(w.dir, "back", "deep", "g.txt")); err != nil || string(b) != "guest to host\n" {
			t.Errorf("copied back: %q, %v", b, err)
		}
		if b, _ := os.ReadFile(filepath.Join(w.dir, "in-back.txt")); string(b) != "host to guest\n" {
			t.Errorf("round trip: %q", b)
		}
		if out, err := w.abox("scp", "in.txt", "other.txt"); err == nil || !strings.Contains(out, "neither side") {
			t.Errorf("host-to-host scp: %v\n%s", err, out)
		}
	})

	// A repository ships links where the user's paths go: `results ->
	// /etc`, `docs -> ~/.ssh`, `mnt -> /var/spool/cron/crontabs` (here
	// directories outside the project stand in). Shell completion adds
	// the trailing slash, which makes every system call follow a link.
	t.Run("scp and mount refuse planted links, with or without a trailing slash, and write nothing through them", func(t *testing.T) {
		etc, ssh, spool := t.TempDir(), t.TempDir(), t.TempDir()
		writeFile(t, filepath.Join(ssh, "id_ed25519"), "HOST SECRET\n", 0o600)
		crontabs := filepath.Join(spool, "crontabs")
		os.Mkdir(crontabs, 0o755)
		links := map[string]string{"results": etc, "docs": ssh, "mnt-link": crontabs, "spool": spool}
		for name, target := range links {
			if err := os.Symlink(target, filepath.Join(w.dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		defer func() {
			for name := range links {
				os.Remove(filepath.Join(w.dir, name))
			}
		}()
		w.guest(t, "mkdir -p linkout && echo '* * * * * root guest' > linkout/job && echo ssh-ed25519 GUEST > authorized_keys")
		for _, args := range [][]string{
			{"scp", "-r", "wf:linkout", "./results/"},
			{"scp", "-r", "wf:linkout", "results"},
			{"scp", "wf:authorized_keys", "./results/authorized_keys"},
			{"scp", "-r", "docs/", "wf:in-link1"},
			{"scp", "-r", "docs", "wf:in-link2"},
			{"scp", "docs/id_ed25519", "wf:in-link3"},
			{"mount", "wf:linkout", "./mnt-link/"},
			{"mount", "wf:linkout", "mnt-link"},
			{"mount", "wf:linkout", "./spool/crontabs/"},
		} {
			if out, err := w.abox(args...); err == nil || !strings.Contains(out, "is a symbolic link") {
				t.Errorf("abox %s: %v, want the link refused:\n%s", strings.Join(args, " "), err, out)
			}
		}
		for _, dir := range []string{etc, crontabs} {
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("written through a link into %s: %v", dir, entries)
			}
		}
		if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), spool) {
			t.Errorf("mounted through a link:\n%s", b)
		}
		if got := w.guest(t, "grep -rls 'HOST SECRET' in-link1 in-link2 in-link3 || echo none"); got != "none" {
			t.Errorf("the host key reached the guest: %s", got)
		}
		if m, _ := filepath.Glob(filepath.Join(w.dir, ".abox-scp-*")); len(m) != 0 {
			t.Errorf("staging left behind: %v", m)
		}
		// The real directory beside the links takes the same copy.
		os.Mkdir(filepath.Join(w.dir, "results-real"), 0o755)
		w.must(t, "scp", "-r", "wf:linkout", "./results-real/")
		if b, err := os.ReadFile(filepath.Join(w.dir, "results-real", "linkout", "job")); err != nil || !strings.Contains(string(b), "guest") {
			t.Errorf("into the real directory: %q, %v", b, err)
		}
	})

	t.Run("mount shows guest files, writes through, and never follows guest links into the host", func(t *testing.T) {
		secret := filepath.Join(w.dir, "host-secret")
		writeFile(t, secret, "HOST ONLY\n", 0o600)
		w.guest(t, "mkdir -p share && echo in the guest > share/g.txt && ln -sfn "+secret+" share/link")
		os.MkdirAll(mnt, 0o755)
		w.must(t, "mount", "wf:share", mnt)
		if b, err := os.ReadFile(filepath.Join(mnt, "g.txt")); err != nil || string(b) != "in the guest\n" {
			t.Errorf("guest file through the mount: %q, %v", b, err)
		}
		if err := os.WriteFile(filepath.Join(mnt, "h.txt"), []byte("from the host\n"), 0o644); err != nil {
			t.Errorf("writing through the mount: %v", err)
		}
		if got := w.guest(t, "cat share/h.txt"); got != "from the host" {
			t.Errorf("host write in the guest: %q", got)
		}
		// The link names a host path; resolved on the host it would read
		// and overwrite the host's file.
		if b, err := os.ReadFile(filepath.Join(mnt, "link")); err == nil && strings.Contains(string(b), "HOST ONLY") {
			t.Errorf("a guest symlink read a host file through the mount")
		}
		os.WriteFile(filepath.Join(mnt, "link"), []byte("overwritten by the guest's link\n"), 0o644)
		if b, _ := os.ReadFile(secret); string(b) != "HOST ONLY\n" {
			t.Errorf("a write through a guest symlink changed the host file: %q", b)
		}
		if out, err := w.abox("mount", "wf:share", mnt); err == nil {
			t.Errorf("a second mount on the same directory: %s", out)
		}
		w.must(t, "unmount", mnt)
		if entries, _ := os.ReadDir(mnt); len(entries) != 0 {
			t.Errorf("after unmount the directory still shows %d entries", len(entries))
		}
		w.must(t, "mount", "wf:share", mnt, "--read-only")
		if err := os.WriteFile(filepath.Join(mnt, "ro.txt"), []byte("x"), 0o644); err == nil {
			t.Errorf("wrote through a read-only mount")
		}
		// Left mounted: remove must take it down.
	})

	t.Run("forward reaches a guest server from host loopback and only there", func(t *testing.T) {
		w.guest(t, "mkdir -p www && echo served-by-guest > www/index.html && cd www && (setsid nohup python3 -m http.server 8080 --bind 127.0.0.1 >/dev/null 2>&1 </dev/null &) ; for i in $(seq 60); do curl -s -m 2 --noproxy '*' -o /dev/null http://127.0.0.1:8080/ && exit 0; sleep 1; done; exit 1")
		w.must(t, "forward", "add", "wf", "18080:8080")
		if out, err := w.inNS(20*time.Second, "curl", "-sS", "-m", "10", "http://127.0.0.1:18080/"); err != nil || !strings.Contains(out, "served-by-guest") {
			t.Errorf("forward from host loopback: %v %q", err, out)
		}
		if out, err := w.inNS(20*time.Second, "curl", "-sS", "-m", "5", "http://"+gw+":18080/"); err == nil {
			t.Errorf("the forward answered on the gateway address %s: %q", gw, out)
		}
		if out := w.must(t, "forward", "list", "wf"); !strings.Contains(out, "18080:8080") || !strings.Contains(out, "active") {
			t.Errorf("forward list:\n%s", out)
		}
		if out, err := w.abox("forward", "add", "wf", "18080:8081"); err == nil {
			t.Errorf("a second forward on a used host port: %s", out)
		}
		// Throughput through the forward and with scp, for the record.
		w.guest(t, "head -c 33554432 /dev/urandom > www/big.bin")
		t0 := time.Now()
		if out, err := w.inNS(2*time.Minute, "curl", "-sS", "-m", "110", "-o", "/dev/null", "-w", "%{size_download}", "http://127.0.0.1:18080/big.bin"); err != nil || strings.TrimSpace(out) != "33554432" {
			t.Errorf("32 MiB through the forward: %v %q", err, out)
		} else {
			t.Logf("FIGURE forward throughput (host loopback -> guest over SSH, TCG guest): %.1f MiB/s", 32/time.Since(t0).Seconds())
		}
		t0 = time.Now()
		w.must(t, "scp", "wf:www/big.bin", "./big.bin")
		t.Logf("FIGURE scp guest -> host, 32 MiB (TCG guest): %.1f MiB/s", 32/time.Since(t0).Seconds())
		os.Remove(filepath.Join(w.dir, "big.bin"))
		w.guest(t, "rm -f www/big.bin")
		w.must(t, "forward", "remove", "wf", "18080:8080")
		if out, err := w.inNS(10*time.Second, "curl", "-sS", "-m", "5", "http://127.0.0.1:18080/"); err == nil {
			t.Errorf("the forward still answers after remove: %q", out)
		}
		w.must(t, "forward", "add", "wf", "18080:8080") // kept for remove to clean up
	})

	t.Run("a reverse forward needs --reverse and warns that it bypasses the filters", func(t *testing.T) {
		srv := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+l.Env.Name, "--", "python3", "-m", "http.server", "18090", "--bind", "127.0.0.1", "--directory", w.dir)
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { srv.Process.Kill(); srv.Wait() }()
		if out, err := w.abox("ssh", "wf", "--", "curl -sS -m 5 --noproxy '*' http://127.0.0.1:9090/in.txt"); err == nil {
			t.Fatalf("the guest reached the host service before any forward: %s", out)
		}
		out := w.must(t, "forward", "add", "wf", "18090:9090", "--reverse")
		if !strings.Contains(out, "bypasses the DNS and HTTP filters") {
			t.Errorf("no warning:\n%s", out)
		}
		var got string
		poll(ctx, 30*time.Second, func() bool {
			got, _ = w.abox("ssh", "wf", "--", "curl -sS -m 5 --noproxy '*' http://127.0.0.1:9090/in.txt")
			return strings.Contains(got, "host to guest")
		})
		if !strings.Contains(got, "host to guest") {
			t.Errorf("the reverse forward did not reach the host service: %q", got)
		}
		w.must(t, "forward", "remove", "wf", "18090:9090", "--reverse")
	})

	t.Run("up on the existing instance reports drift and applies the allowlist and forwards live", func(t *testing.T) {
		os.WriteFile(filepath.Join(w.dir, "abox.yaml"), []byte(strings.Replace(yaml(2, "forwards: [\"18081:22\"]\n"), "allowlist: [allowed.test, www.allowed.test,", "allowlist: [allowed.test, late.test,", 1)), 0o644)
		if out, err := w.abox("up"); err == nil || !strings.Contains(out, "not trusted") {
			t.Fatalf("a changed widening file was not asked about again: %v\n%s", err, out)
		}
		w.must(t, "trust")
		out := w.must(t, "up")
		for _, want := range []string{"drift: cpus: the file says 2, instance wf has 1", "allowlist +late.test", "allowlist -www.allowed.test", "forward host 127.0.0.1:18081 -> guest 127.0.0.1:22"} {
			if !strings.Contains(out, want) {
				t.Errorf("up output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "running setup.sh") {
			t.Errorf("up provisioned again:\n%s", out)
		}
		if got := w.guest(t, "dig +short @"+gw+" late.test"); !strings.Contains(got, lab.OriginIP) {
			t.Errorf("late.test after up = %q", got)
		}
		if out, err := w.inNS(10*time.Second, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/18081 && head -c 7 <&3"); err != nil || !strings.HasPrefix(out, "SSH-2.0") {
			t.Errorf("forward from abox.yaml: %v %q", err, out)
		}
	})

	t.Run("an exported instance imports under a new name and boots with its files and filters", func(t *testing.T) { w.exportImport(t) })

	t.Run("down stops forwards; up brings the instance and its forwards back", func(t *testing.T) {
		w.must(t, "down")
		if out, err := w.inNS(10*time.Second, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/18081"); err == nil {
			t.Errorf("the forward answers after down: %q", out)
		}
		if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), mnt) {
			t.Errorf("%s still mounted after down", mnt)
		}
		out := w.must(t, "up")
		if strings.Contains(out, "running setup.sh") {
			t.Errorf("up provisioned again after a restart:\n%s", out)
		}
		var got string
		poll(ctx, 60*time.Second, func() bool {
			got, _ = w.inNS(10*time.Second, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/18081 && head -c 7 <&3")
			return strings.HasPrefix(got, "SSH-2.0")
		})
		if !strings.HasPrefix(got, "SSH-2.0") {
			t.Errorf("the forward did not come back with the instance: %q", got)
		}
		if got := w.must(t, "forward", "list", "wf"); !strings.Contains(got, "active") || !strings.Contains(got, "18080:8080") {
			t.Errorf("forward list after up:\n%s", got)
		}
	})

	t.Run("down --rm leaves nothing", func(t *testing.T) {
		os.MkdirAll(mnt, 0o755)
		w.must(t, "mount", "wf", mnt)
		w.must(t, "down", "--rm")
		if _, err := os.Stat(paths.Layout{Root: l.Home}.InstanceDir("wf")); err == nil {
			t.Errorf("instance directory left")
		}
		if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), mnt) {
			t.Errorf("%s still mounted after down --rm", mnt)
		}
		for _, port := range []string{"18080", "18081"} {
			if out, err := w.inNS(10*time.Second, "bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+port); err == nil {
				t.Errorf("forward %s answers after down --rm: %q", port, out)
			}
		}
		if out, _ := exec.Command("pgrep", "-f", "abox forward run wf").CombinedOutput(); strings.TrimSpace(string(out)) != "" {
			t.Errorf("forward supervisors left: %s", out)
		}
		for _, args := range [][]string{{"list", "--all", "--name"}, {"net-list", "--all", "--name"}, {"nwfilter-list"}} {
			out, _ := l.Env.Virsh(ctx, args...)
			if strings.Contains(out, "wf") {
				t.Errorf("virsh %s still lists wf:\n%s", args[0], out)
			}
		}
	})
}
