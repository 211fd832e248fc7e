package cli

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/monitor"
	"github.com/abox-dev/abox/internal/paths"
)

func TestMonitorCommands(t *testing.T) {
	root := t.TempDir()
	l := paths.Layout{Root: root}
	saveState(t, root, instance.State{Name: "plain", Gateway: netip.MustParseAddr("10.10.8.1")})
	if _, err := runCLI(l, "monitor", "status", "plain"); err == nil || !strings.Contains(err.Error(), "has no monitor") {
		t.Errorf("status of an unmonitored instance = %v", err)
	}
	saveState(t, root, instance.State{Name: "mon", Gateway: netip.MustParseAddr("10.10.9.1"), Monitor: true})
	f := l.Instance("mon")
	os.MkdirAll(f.LogsDir, 0o700)
	uid := uint32(0)
	var lines []string
	for _, ev := range []monitor.Event{
		{Received: time.Now(), Type: monitor.TypeExec, Process: &monitor.Proc{Binary: "/usr/bin/id", UID: &uid}},
		{Received: time.Now(), Type: monitor.TypeFile, Path: "/etc/shadow", Op: "read", Process: &monitor.Proc{Binary: "/bin/cat"}},
		{Received: time.Now(), Type: monitor.TypeExec, Process: &monitor.Proc{Binary: "/bin/\x1b[2Jevil"}},
	} {
		b, _ := json.Marshal(ev)
		lines = append(lines, string(b))
	}
	os.WriteFile(f.MonitorLog, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	out, err := runCLI(l, "monitor", "logs", "--type", "exec", "mon")
	if err != nil || !strings.Contains(out, "/usr/bin/id uid=0") || strings.Contains(out, "/etc/shadow") {
		t.Errorf("logs --type exec = %v\n%s", err, out)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("logs printed an escape raw: %q", out)
	}
	out, err = runCLI(l, "monitor", "logs", "--json", "-n", "1", "--type", "file", "mon")
	if err != nil || strings.Count(out, "\n") != 1 || !strings.Contains(out, `"path":"/etc/shadow"`) {
		t.Errorf("logs --json -n 1 = %v\n%s", err, out)
	}
	if _, err := runCLI(l, "monitor", "logs", "--type", "bogus", "mon"); err == nil {
		t.Error("--type bogus accepted")
	}
	out, err = runCLI(l, "monitor", "status", "mon")
	if err != nil || !strings.Contains(out, "not running") {
		t.Errorf("status without a monitor process = %v\n%s", err, out)
	}
}

// TestFollowLogRotation: -f keeps printing across a rotation.
func TestFollowLogRotation(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/monitor.log"
	os.WriteFile(path, []byte("one\n"), 0o600)
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- followLog(ctx, path, 10, true, "", func(b []byte) { got <- strings.TrimSpace(string(b)) })
	}()
	want := func(s string) {
		t.Helper()
		select {
		case g := <-got:
			if g != s {
				t.Fatalf("got %q, want %q", g, s)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("never got %q", s)
		}
	}
	want("one")
	fh, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	fh.WriteString("two\n")
	fh.Close()
	want("two")
	os.Rename(path, path+".1")
	os.WriteFile(path, []byte("three\n"), 0o600)
	want("three")
	cancel()
	<-done
}
