package cloudinit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestMonitorForwarder runs the real forwarder with python3 against a file
// standing in for the virtio-serial port: it sends a heartbeat, forwards
// whole lines written to the export file after it started, drops an
// oversized one, and follows a rotation.
func TestMonitorForwarder(t *testing.T) {
	py := need.Program(t, "python3")
	dir := t.TempDir()
	script := filepath.Join(dir, "fwd.py")
	os.WriteFile(script, []byte(monitorForwarder), 0o755)
	port := filepath.Join(dir, "port")
	os.WriteFile(port, nil, 0o600)
	export := filepath.Join(dir, "tetragon.log")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, script)
	cmd.Env = append(os.Environ(), "ABOX_MONITOR_PORT="+port, "ABOX_MONITOR_EXPORT="+export)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	wait := func(want string) string {
		t.Helper()
		for ctx.Err() == nil {
			b, _ := os.ReadFile(port)
			if strings.Contains(string(b), want) {
				return string(b)
			}
			time.Sleep(100 * time.Millisecond)
		}
		b, _ := os.ReadFile(port)
		t.Fatalf("port never got %q; it holds:\n%s\nstderr: %s", want, b, stderr.String())
		return ""
	}
	wait(`"abox_heartbeat"`)
	f, _ := os.OpenFile(export, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	f.WriteString(`{"process_exec":{"process":{"binary":"/bin/one"}}}` + "\n")
	f.WriteString(strings.Repeat("x", 70000) + "\n")
	f.WriteString(`{"process_exec":{"process":{"binary":"/bin/two"}}}` + "\n")
	f.WriteString(`{"partial":`)
	f.Close()
	got := wait("/bin/two")
	if strings.Contains(got, "xxxxxxxxxx") || strings.Contains(got, "partial") {
		t.Errorf("forwarded an oversized or partial line")
	}
	// Rotation: the old file is renamed away, a new one takes its place.
	os.Rename(export, export+".1")
	os.WriteFile(export, []byte(`{"process_exec":{"process":{"binary":"/bin/three"}}}`+"\n"), 0o600)
	wait("/bin/three")
}

func TestUserDataMonitor(t *testing.T) {
	c := testConfig(t)
	plain, err := UserData(c)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain), MonitorUnit) {
		t.Errorf("an unmonitored guest gets the forwarder:\n%s", plain)
	}
	c.Monitor = true
	ud, err := UserData(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{MonitorForwarderPath, "/etc/systemd/system/" + MonitorUnit, MonitorPort} {
		if !strings.Contains(string(ud), want) {
			t.Errorf("monitored user-data lacks %q", want)
		}
	}
}
