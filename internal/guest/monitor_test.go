package guest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/tetragon/tetragontest"
)

// fakeGuest puts an ssh on PATH that records its command line and stdin
// and exits with the status in dir/rc (installed: 0; not yet: 3), printing
// dir/say.
func fakeGuest(t *testing.T) (dir string) {
	dir = t.TempDir()
	script := `#!/bin/sh
d=` + dir + `
n=$(ls "$d" | grep -c '^call.*args$')
printf '%s\n' "$@" >"$d/call$n.args"
cat >"$d/call$n.stdin"
cat "$d/say" 2>/dev/null
rc=$(cat "$d/rc" 2>/dev/null || echo 0)
rm -f "$d/rc"
exit $rc
`
	if err := os.WriteFile(filepath.Join(dir, "ssh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	return dir
}

func monitoredTarget(t *testing.T, bundle []byte) Target {
	t.Helper()
	l := paths.Layout{Root: t.TempDir()}
	st := instance.State{Name: "dev", User: "abox", GuestIP: netip.MustParseAddr("10.10.0.10"), Monitor: true}
	f := l.Instance(st.Name)
	os.MkdirAll(filepath.Dir(f.SSHKey), 0o700)
	os.MkdirAll(f.RunDir, 0o700)
	os.WriteFile(f.SSHKey, []byte("key"), 0o600)
	if bundle != nil {
		p := filepath.Join(l.Root, "bundle.tar.gz")
		os.WriteFile(p, bundle, 0o600)
		sum := sha256.Sum256(bundle)
		st.MonitorBundle = &instance.MonitorBundle{SHA256: hex.EncodeToString(sum[:]), Source: "test", Path: p, Size: int64(len(bundle))}
	}
	return Target{Layout: l, State: st}
}

func calls(t *testing.T, dir string) (args, stdin []string) {
	t.Helper()
	for i := 0; ; i++ {
		a, err := os.ReadFile(filepath.Join(dir, "call"+string(rune('0'+i))+".args"))
		if err != nil {
			return
		}
		in, _ := os.ReadFile(filepath.Join(dir, "call"+string(rune('0'+i))+".stdin"))
		args, stdin = append(args, string(a)), append(stdin, string(in))
	}
}

func TestStartMonitorAgentWithoutBundle(t *testing.T) {
	dir := fakeGuest(t)
	tg := monitoredTarget(t, nil)
	if err := StartMonitorAgent(context.Background(), tg, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	args, _ := calls(t, dir)
	if len(args) != 1 || !strings.Contains(args[0], "systemctl enable --now "+cloudinit.MonitorUnit) {
		t.Fatalf("ssh calls: %q", args)
	}
	rec, err := ReadAgentSetup(tg.Layout.Instance("dev").MonitorAgent)
	if err != nil || rec.At.IsZero() || rec.Installed || rec.Error != "" {
		t.Errorf("record %+v %v", rec, err)
	}
}

// TestStartMonitorAgentInstallsOnce: the bundle crosses only when the guest
// lacks it, exactly as cached; a cached copy that changed is not sent.
func TestStartMonitorAgentInstallsOnce(t *testing.T) {
	bundle := tetragontest.Tarball(tetragontest.Agent)
	dir := fakeGuest(t)
	tg := monitoredTarget(t, bundle)
	os.WriteFile(filepath.Join(dir, "rc"), []byte("3"), 0o600) // not installed yet
	var progress bytes.Buffer
	if err := StartMonitorAgent(context.Background(), tg, &progress); err != nil {
		t.Fatal(err)
	}
	args, stdin := calls(t, dir)
	if len(args) != 2 || !strings.Contains(args[0], cloudinit.TetragonMarker) || stdin[0] != "" {
		t.Fatalf("first call should only ask: %q", args)
	}
	if !strings.Contains(args[1], "want="+tg.State.MonitorBundle.SHA256) || stdin[1] != string(bundle) {
		t.Fatalf("second call did not send the bundle with its digest (%d bytes sent)", len(stdin[1]))
	}
	if rec, _ := ReadAgentSetup(tg.Layout.Instance("dev").MonitorAgent); !rec.Installed || rec.Bundle != tg.State.MonitorBundle.SHA256 {
		t.Errorf("record %+v", rec)
	}
	// Installed: the next start sends nothing.
	dir2 := fakeGuest(t)
	if err := StartMonitorAgent(context.Background(), tg, &progress); err != nil {
		t.Fatal(err)
	}
	if args, _ := calls(t, dir2); len(args) != 1 {
		t.Errorf("an installed guest got %d calls", len(args))
	}
	// The cached copy changed after create: refused, nothing sent.
	dir3 := fakeGuest(t)
	os.WriteFile(filepath.Join(dir3, "rc"), []byte("3"), 0o600)
	os.WriteFile(tg.State.MonitorBundle.Path, append(bundle[:len(bundle):len(bundle)], 0), 0o600)
	err := StartMonitorAgent(context.Background(), tg, &progress)
	if err == nil {
		t.Fatal("a changed cached bundle was installed")
	}
	if args, _ := calls(t, dir3); len(args) != 1 {
		t.Errorf("the changed bundle was sent: %d calls", len(args))
	}
	if rec, _ := ReadAgentSetup(tg.Layout.Instance("dev").MonitorAgent); rec.Error == "" {
		t.Errorf("the failure is not recorded: %+v", rec)
	}
}

// TestStartMonitorAgentCleansGuestOutput: what the guest prints on a
// failure reaches the operator without terminal controls.
func TestStartMonitorAgentCleansGuestOutput(t *testing.T) {
	dir := fakeGuest(t)
	os.WriteFile(filepath.Join(dir, "say"), []byte("boom\x1b]0;pwned\x07\x1b[2J"), 0o600)
	os.WriteFile(filepath.Join(dir, "rc"), []byte("1"), 0o600)
	err := StartMonitorAgent(context.Background(), monitoredTarget(t, nil), &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "boom") || strings.ContainsAny(err.Error(), "\x1b\x07") {
		t.Fatalf("error %q", err)
	}
}

// TestStartMonitorAgentBoundsGuestOutput: a guest that answers the setup
// with 64 MiB of output costs the host its last 2 KB, not the whole stream
// (it cost 319 MiB before), and the end of it still names the failure.
func TestStartMonitorAgentBoundsGuestOutput(t *testing.T) {
	dir := t.TempDir()
	script := "#!/bin/sh\nhead -c 67108864 /dev/zero | tr '\\0' x\necho; echo the-real-reason >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(dir, "ssh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := StartMonitorAgent(context.Background(), monitoredTarget(t, nil), &bytes.Buffer{})
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
		t.Errorf("reading 64 MiB of guest output allocated %d MiB", n>>20)
	}
	if err == nil || !strings.Contains(err.Error(), "the-real-reason") || len(err.Error()) > 4<<10 {
		t.Fatalf("error of %d bytes, want the end of the output: %.200q", len(fmt.Sprint(err)), fmt.Sprint(err))
	}
}
