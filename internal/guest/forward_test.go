package guest

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// TestForwardSSHDiesWithItsSupervisor: a forward supervisor killed outright
// (SIGKILL, no chance to stop its child) takes its ssh with it: an orphaned
// ssh would keep the host port and the guest's connection with nobody to
// stop it.
func TestForwardSSHDiesWithItsSupervisor(t *testing.T) {
	if os.Getenv("ABOX_TEST_RUN_FORWARD") == "1" {
		// The supervisor (abox forward run) of the parent's instance.
		tg := Target{Layout: paths.Layout{Root: os.Getenv("ABOX_TEST_ROOT")}, State: instance.State{Name: "dev", User: "abox", GuestIP: netip.MustParseAddr("10.10.5.10")}}
		if err := RunForward(t.Context(), tg, Forward{HostPort: 18080, GuestPort: 80}, os.Stderr); err != nil {
			t.Fatal(err)
		}
		return
	}
	tg := testTarget(t)
	bin := t.TempDir()
	pidFile := filepath.Join(t.TempDir(), "ssh.pid")
	os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\necho $$ > "+pidFile+"\nexec /bin/sleep 60\n"), 0o755)
	cmd := exec.Command(os.Args[0], "-test.run=^TestForwardSSHDiesWithItsSupervisor$")
	cmd.Env = append(os.Environ(), "ABOX_TEST_RUN_FORWARD=1", "PATH="+bin, "ABOX_TEST_ROOT="+tg.Layout.Root)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	for i := 0; i < 500 && pid == 0; i++ {
		time.Sleep(20 * time.Millisecond)
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	}
	if pid == 0 {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the supervisor never started ssh")
	}
	defer syscall.Kill(pid, syscall.SIGKILL)
	cmd.Process.Kill()
	cmd.Wait()
	for i := 0; i < 250 && alive(pid); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(pid) {
		t.Errorf("ssh %d outlived its killed supervisor", pid)
	}
}

// alive reports whether pid runs (a zombie, exited but not yet reaped by
// init, does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || !strings.HasPrefix(string(b[i+1:]), " Z")
}
