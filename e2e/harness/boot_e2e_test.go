//go:build e2e

package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestBootDebian12 proves the whole chain the VM layer relies on: a private
// libvirtd in a network namespace, an isolated network, a TCG guest booted
// directly from the debootstrap image through a qcow2 overlay, configured by
// a NoCloud seed, reachable over SSH from inside the namespace, and powered
// off by ACPI. It drives libvirt with virsh and the XML in testdata/.
//
//	go test -tags e2e -run TestBootDebian12 -v -timeout 30m ./e2e/harness/
//
// ABOX_E2E_KEEP=1 keeps the environment after a failure for inspection
// (clean it later with the same test name or CleanupPrefix).
func TestBootDebian12(t *testing.T) {
	need.Root(t, "libvirtd in a namespace")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	logf := func(format string, args ...any) { t.Logf(format, args...) }

	start := time.Now()
	built, err := image.Builder{Run: image.ExecRunner{}}.BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), func(stage string, _, _ int64) {
		logf("image: %s after %s", stage, time.Since(start).Round(time.Second))
	})
	if err != nil {
		t.Fatal(err)
	}

	envStart := time.Now()
	env, err := Start(ctx, "boot", Options{Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	logf("environment up in %s (libvirtd %s)", time.Since(envStart).Round(time.Millisecond), env.Startup.Round(time.Millisecond))
	defer func() {
		if t.Failed() {
			if out, err := env.Virsh(context.WithoutCancel(ctx), "domstate", "--reason", "abx-test0"); err == nil {
				logf("domain state: %s", strings.TrimSpace(out))
			}
			if b, err := os.ReadFile(filepath.Join(env.LogDir(), "qemu", "abx-test0.log")); err == nil {
				logf("qemu log tail:\n%s", lastLines(string(b), 15))
			}
			if b, err := os.ReadFile(filepath.Join(env.Dir, "vm", "console.log")); err == nil {
				logf("console.log, notable lines:\n%s", notable(string(b)))
				logf("console.log tail:\n%s", lastLines(string(b), 60))
			}
			if os.Getenv("ABOX_E2E_KEEP") != "" {
				logf("keeping %s (%s)", env.Name, env.Dir)
				return
			}
		}
		if err := env.Close(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}()

	vm := filepath.Join(env.Dir, "vm")
	if err := os.MkdirAll(filepath.Join(vm, "seed"), 0o755); err != nil {
		t.Fatal(err)
	}
	must := func(out []byte, err error) string {
		t.Helper()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return string(out)
	}
	key := filepath.Join(vm, "id_ed25519")
	must(exec.CommandContext(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "abox-e2e", "-f", key).CombinedOutput())
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	subst := strings.NewReplacer("@SSH_PUBLIC_KEY@", strings.TrimSpace(string(pub)), "@DIR@", vm, "@BASE@", built.Dir)
	render := func(name, dst string) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, []byte(subst.Replace(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"user-data", "meta-data", "network-config"} {
		render(f, filepath.Join(vm, "seed", f))
	}
	render("network.xml", filepath.Join(vm, "network.xml"))
	render("domain.xml", filepath.Join(vm, "domain.xml"))
	must(exec.CommandContext(ctx, "genisoimage", "-quiet", "-output", filepath.Join(vm, "seed.iso"),
		"-volid", "cidata", "-joliet", "-rock",
		filepath.Join(vm, "seed", "user-data"), filepath.Join(vm, "seed", "meta-data"), filepath.Join(vm, "seed", "network-config")).CombinedOutput())
	must(exec.CommandContext(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", built.Disk, filepath.Join(vm, "overlay.qcow2"), "4G").CombinedOutput())

	virsh := func(args ...string) string {
		t.Helper()
		out, err := env.Virsh(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	virsh("net-define", filepath.Join(vm, "network.xml"))
	virsh("net-start", "abx-test0")
	virsh("define", filepath.Join(vm, "domain.xml"))
	bootStart := time.Now()
	virsh("start", "abx-test0")

	ssh := func(ctx context.Context, command string) ([]byte, error) {
		return env.NetCommand(ctx, "ssh", "-i", key,
			"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
			"-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR",
			"abox@10.10.5.10", command).CombinedOutput()
	}
	var lastErr string
	err = poll(ctx, 10*time.Minute, func() (bool, error) {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		out, err := ssh(c, "true")
		if err == nil {
			return true, nil
		}
		lastErr = strings.TrimSpace(string(out))
		time.Sleep(2 * time.Second)
		return false, nil
	})
	if err != nil {
		t.Fatalf("guest never answered SSH: %v (last: %s)", err, lastErr)
	}
	sshReady := time.Since(bootStart)
	logf("SSH ready %s after virsh start", sshReady.Round(100*time.Millisecond))

	checks := []struct{ name, cmd, want string }{
		{"address", "ip -4 -o addr show eth0", "10.10.5.10/24"},
		{"default route", "ip route show default", "via 10.10.5.1"},
		{"resolver", "resolvectl dns eth0", "10.10.5.1"},
		{"sudo", "sudo -n true && echo sudo-ok", "sudo-ok"},
		{"cloud-init", "cloud-init status --wait --long || true", "status: done"},
		// The image turns IPv6 off on eth0 (see image.Debian12Recipe).
		{"no IPv6", `test -z "$(ip -6 -o addr show dev eth0)" && echo no-ipv6-address`, "no-ipv6-address"},
		{"host keys", "ls /etc/ssh/", "ssh_host_ed25519_key.pub"},
		{"machine-id", "cat /etc/machine-id", ""},
		{"kernel", "uname -r; cat /proc/cmdline", "root=/dev/vda"},
		{"root grown", "df -BM --output=size / | tail -1", ""},
		// Informational: where the boot time goes under TCG.
		{"boot time", "systemd-analyze time; systemd-analyze blame | head -8", ""},
		{"network log", "sudo journalctl -b --no-pager -o short-monotonic -u systemd-networkd -u systemd-networkd-wait-online | tail -25", ""},
	}
	for _, c := range checks {
		t0 := time.Now()
		out, err := ssh(ctx, c.cmd)
		logf("%s (%s, %s since start): %s", c.name, time.Since(t0).Round(10*time.Millisecond), time.Since(bootStart).Round(100*time.Millisecond), strings.TrimSpace(string(out)))
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %q gave %q, %v; want %q", c.name, c.cmd, out, err, c.want)
		}
	}

	// ACPI shutdown and wait: a hard power-off right after first boot can
	// leave cloud-init's files empty (LAB.md).
	offStart := time.Now()
	virsh("shutdown", "abx-test0")
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		out, err := env.Virsh(ctx, "domstate", "abx-test0")
		return err == nil && strings.Contains(out, "shut off"), nil
	})
	if err != nil {
		t.Fatalf("guest did not power off after ACPI shutdown: %v", err)
	}
	logf("ACPI shutdown took %s", time.Since(offStart).Round(100*time.Millisecond))
	virsh("undefine", "abx-test0")
	virsh("net-destroy", "abx-test0")
	virsh("net-undefine", "abx-test0")
	fmt.Fprintf(os.Stderr, "TIMING libvirtd=%s ssh_ready=%s\n", env.Startup.Round(time.Millisecond), sshReady.Round(100*time.Millisecond))
}

// notable picks the console lines that explain an unexpected stop.
func notable(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		for _, k := range []string{"Power key", "power_state", "Powering off", "reboot:", "panic", "Oops", "Stopping", "Reached target shutdown", "systemd-logind", "Failed"} {
			if strings.Contains(l, k) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > 40 {
		out = out[:40]
	}
	return strings.Join(out, "\n")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
