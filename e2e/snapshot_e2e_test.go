//go:build e2e

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
)

// snapshotChecks take a snapshot of the suite's running guest, change the
// guest and the host-side policy, revert, and check that the guest came
// back while the policy did not: the file deleted after the snapshot is
// there again, the name allowlisted only at snapshot time is refused, and
// direct egress still goes nowhere. The shared base image is never
// written.
func (s *suite) snapshotChecks(t *testing.T, st instance.State, proxy string) {
	t.Run("a snapshot reverts the guest, never the host side", func(t *testing.T) {
		base := filepath.Join(s.home, "images", st.Base, image.DiskFile)
		before, err := os.Stat(base)
		if err != nil {
			t.Fatal(err)
		}
		s.mustGuest(t, "dev", "echo kept-by-the-snapshot > ~/snapfile && sync")
		s.mustAbox("allowlist", "add", "dev", "late.test")
		if out := s.mustGuest(t, "dev", "curl -sS -m 15 --noproxy '' -o /dev/null -w '%{http_code}' -x "+proxy+" http://late.test/"); out != "200" {
			t.Fatalf("late.test while allowlisted = %q", out)
		}

		t0 := time.Now()
		s.mustAbox("snapshot", "create", "dev", "warm", "--description", "snapfile present")
		t.Logf("FIGURE snapshot-create-running (%d MiB guest, TCG): %s", st.MemoryMiB, time.Since(t0).Round(100*time.Millisecond))

		taken := time.Now()
		s.mustGuest(t, "dev", "rm ~/snapfile && sync")
		s.mustAbox("allowlist", "remove", "dev", "late.test")
		// The guest's clock resumes at the snapshot's: let it fall
		// clearly behind, so that the check below sees the revert set it.
		time.Sleep(time.Until(taken.Add(15 * time.Second)))

		t0 = time.Now()
		out := s.mustAbox("snapshot", "revert", "dev", "warm")
		t.Logf("FIGURE snapshot-revert-running: %s", time.Since(t0).Round(100*time.Millisecond))
		if !strings.Contains(out, "the guest runs as it was") {
			t.Errorf("revert says:\n%s", out)
		}
		if err := s.waitSSH("dev", 2*time.Minute); err != nil {
			t.Fatalf("no SSH after the revert: %v", err)
		}
		clock := s.mustGuest(t, "dev", "date +%s")
		guest, err := strconv.ParseInt(strings.TrimSpace(clock), 10, 64)
		if lag := time.Since(time.Unix(guest, 0)); err != nil || lag > 5*time.Second || lag < -5*time.Second {
			t.Errorf("after the revert the guest's clock is %v off the host's (%q, %v)", lag.Round(time.Second), clock, err)
		}
		if out := s.mustGuest(t, "dev", "cat ~/snapfile"); strings.TrimSpace(out) != "kept-by-the-snapshot" {
			t.Errorf("after the revert ~/snapfile = %q, want the snapshot's", out)
		}
		// The allowlist as it is now, not as it was at the snapshot.
		if out, _ := s.guest("dev", "curl -sS -m 15 --noproxy '' -o /dev/null -w '%{http_code}' -x "+proxy+" http://late.test/"); out != "403" {
			t.Errorf("late.test after the revert = %q, want 403 (it was removed after the snapshot)", out)
		}
		for _, target := range []string{originIP + ":80", hostSide + ":8081"} {
			if out, err := s.guest("dev", "curl -sS -m 5 --noproxy '*' http://"+target+"/ 2>&1"); err == nil {
				t.Errorf("after the revert, direct TCP to %s succeeded: %q", target, out)
			}
		}
		if out, err := s.inNS(10*time.Second, "iptables", "-w", "10", "-t", hostfw.Table, "-S"); err != nil || !strings.Contains(out, hostfw.ChainName(st.Bridge)) {
			t.Errorf("after the revert the host chain %s is missing (%v)", hostfw.ChainName(st.Bridge), err)
		}
		if out, err := s.env.Virsh(s.ctx, "nwfilter-binding-list"); err != nil || !strings.Contains(out, "abox-dev") {
			t.Errorf("after the revert the packet filter is not bound to the guest's port (%v):\n%s", err, out)
		}

		var list []instance.SnapshotInfo
		out = s.mustAbox("snapshot", "list", "dev", "--json")
		if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &list); err != nil {
			t.Fatalf("snapshot list --json: %v\n%s", err, out)
		}
		if len(list) == 1 {
			t.Logf("FIGURE snapshot-memory-saved: %d MiB", list[0].MemoryBytes>>20)
		}
		if len(list) != 1 || list[0].Name != "warm" || !list[0].Current || list[0].State != "running" || list[0].Description != "snapfile present" || list[0].MemoryBytes == 0 {
			t.Errorf("snapshot list = %+v", list)
		}
		if out, err := s.abox("snapshot", "create", "dev", "warm"); err == nil || !strings.Contains(out, "snapshot exists") {
			t.Errorf("a second snapshot warm = %v:\n%s", err, out)
		}
		s.mustAbox("snapshot", "remove", "dev", "warm")
		if out := s.mustAbox("snapshot", "list", "dev", "--json"); strings.TrimSpace(out) != "[]" {
			t.Errorf("after remove: %s", out)
		}
		if out, err := s.inNS(30*time.Second, "qemu-img", "snapshot", "-l", "-U", base); err != nil || strings.TrimSpace(out) != "" {
			t.Errorf("the base image has snapshots (%v): %q", err, out)
		}
		if after, err := os.Stat(base); err != nil || !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
			t.Errorf("the base image changed: %v -> %v (%v)", before.ModTime(), after.ModTime(), err)
		}
	})
}

// removeLeavesNoSnapshots takes a snapshot of the stopped instance name,
// for the remove that follows to take with it; check runs after the remove.
func (s *suite) removeLeavesNoSnapshots(t *testing.T, name string) (check func()) {
	t0 := time.Now()
	s.mustAbox("snapshot", "create", name, "cold")
	t.Logf("FIGURE snapshot-create-stopped: %s", time.Since(t0).Round(100*time.Millisecond))
	meta := filepath.Join(s.env.Dir, "lib", "qemu", "snapshot", "abox-"+name)
	if _, err := os.Stat(filepath.Join(meta, "cold.xml")); err != nil {
		t.Errorf("libvirt's record of the snapshot is not where the check looks: %v", err)
	}
	return func() {
		if _, err := os.Stat(meta); !os.IsNotExist(err) {
			t.Errorf("libvirt's snapshot records of %s are left behind in %s (%v)", name, meta, err)
		}
	}
}
