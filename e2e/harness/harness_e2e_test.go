//go:build e2e

package harness

import (
	"context"
	"github.com/abox-dev/abox/internal/testutil/need"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEnvLifecycle checks what the suite relies on: libvirtd answers inside
// the environment on its own socket, the namespace is isolated (only lo),
// starting the same name again replaces the old environment, and Close
// leaves nothing behind, twice.
//
//	go test -tags e2e -run TestEnvLifecycle -v ./e2e/harness/
func TestEnvLifecycle(t *testing.T) {
	need.Root(t, "libvirtd in a namespace")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	logf := func(format string, args ...any) { t.Logf(format, args...) }
	const name = "life"

	first, err := Start(ctx, name, Options{Logf: logf})
	if err != nil {
		t.Fatal(err)
	}
	// Same name again: a crashed run's leftovers are cleaned, not reused.
	env, err := Start(ctx, name, Options{Logf: logf})
	if err != nil {
		first.Close(ctx)
		t.Fatal(err)
	}
	defer env.Close(context.WithoutCancel(ctx))
	if alive(first.HolderPID) {
		t.Errorf("first environment's holder %d survived a restart of the same name", first.HolderPID)
	}
	t.Logf("libvirtd ready after %s", env.Startup)

	out, err := env.Virsh(ctx, "uri")
	if err != nil || !strings.Contains(out, "socket="+env.Socket) {
		t.Errorf("virsh uri = %q, %v", out, err)
	}
	// Inside the mount namespace the default socket path is the private one.
	b, err := env.Command(ctx, "virsh", "-q", "-c", "qemu:///system", "net-list", "--all", "--name").CombinedOutput()
	if err != nil || strings.TrimSpace(string(b)) != "" {
		t.Errorf("net-list inside = %q, %v; want no networks (not the host's)", b, err)
	}
	b, err = env.NetCommand(ctx, "ip", "-o", "link").CombinedOutput()
	if err != nil || strings.Count(strings.TrimSpace(string(b)), "\n") != 0 || !strings.Contains(string(b), "lo:") {
		t.Errorf("links in the namespace = %q, %v; want only lo", b, err)
	}
	if _, err := os.Stat("/run/libvirt/libvirt-sock"); err == nil {
		// A host libvirtd may legitimately run; ours must not be it.
		if filepath.Clean(env.Socket) == "/run/libvirt/libvirt-sock" {
			t.Errorf("environment socket is the host's")
		}
	}

	if err := env.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := netnsExists(ctx, env.Name); ok {
		t.Errorf("namespace %s still exists after Close", env.Name)
	}
	if _, err := os.Stat(env.Dir); err == nil {
		t.Errorf("state directory %s still exists after Close", env.Dir)
	}
	if alive(env.HolderPID) || alive(pidFromFile(filepath.Join(env.Dir, "libvirtd.pid"))) {
		t.Errorf("processes survived Close")
	}
	if err := env.Close(ctx); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := CleanupPrefix(ctx, name, ""); err != nil {
		t.Errorf("CleanupPrefix on nothing = %v", err)
	}
}
