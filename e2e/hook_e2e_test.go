//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/harness"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
)

// TestHookRefusesWithoutQEMU checks, against a real libvirtd (9.0 here)
// and without booting anything, that libvirtd runs abox's hook from
// hooks/qemu.d/ and that the hook's refusal stops `virsh start` with the
// hook's reason: the domain names an instance whose chains and daemon do
// not exist, so QEMU is never started.
func TestHookRefusesWithoutQEMU(t *testing.T) {
	if os.Geteuid() != 0 {
		needVM(t, "needs root (libvirtd in a namespace)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env, err := harness.Start(ctx, "hook", harness.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { env.Close(context.Background()) })
	bin := filepath.Join(env.Dir, "bin", "abox")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "../cmd/abox").CombinedOutput(); err != nil {
		t.Fatalf("building abox: %v\n%s", err, out)
	}
	if _, err := instance.InstallHook(filepath.Join(env.Dir, "etc", "hooks"), bin); err != nil {
		t.Fatal(err)
	}
	// libvirtd looks for hooks when it starts.
	if b, err := os.ReadFile(filepath.Join(env.Dir, "libvirtd.pid")); err == nil {
		var pid int
		for _, c := range strings.TrimSpace(string(b)) {
			pid = pid*10 + int(c-'0')
		}
		syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 300 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := env.StartLibvirtd(ctx); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(env.Dir, "home")
	dom := `<domain type='qemu'><name>abox-hk</name><memory unit='MiB'>64</memory>
<metadata><instance xmlns="` + libvirt.MetadataNamespace + `" name="hk" dir="` + paths.Layout{Root: home}.InstanceDir("hk") + `"/></metadata>
<os><type arch='x86_64'>hvm</type></os><devices><controller type='usb' model='none'/></devices></domain>`
	p := filepath.Join(env.Dir, "hk.xml")
	os.WriteFile(p, []byte(dom), 0o644)
	if out, err := env.Virsh(ctx, "define", p); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := env.Virsh(ctx, "start", "abox-hk")
	if err == nil {
		env.Virsh(ctx, "destroy", "abox-hk")
		t.Fatalf("virsh start of an abox domain without its instance succeeded: libvirtd did not run the hook\n%s", out)
	}
	if !strings.Contains(out, "abox hook") || !strings.Contains(out, "refusing to start hk") {
		t.Errorf("virsh start failed, but not through abox's hook:\n%s", out)
	}
	// A domain that is not abox's is left alone by the script (it exits 0
	// before running abox): defining and starting it is not tested here,
	// since that boots QEMU; TestHookScriptIgnoresOtherDomains covers it.
}
