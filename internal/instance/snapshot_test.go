package instance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/testutil/syncbuf"
	"libvirt.org/go/libvirtxml"
)

func (h *fakeHV) Domain(ctx context.Context, name string) (*libvirtxml.Domain, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.domXML[name]
	if !ok {
		return nil, fmt.Errorf("domain %s: %w", name, libvirt.ErrNotFound)
	}
	var d libvirtxml.Domain
	return &d, d.Unmarshal(x)
}

func (h *fakeHV) CreateSnapshot(ctx context.Context, domain, name, description string) (libvirt.Snapshot, error) {
	if err := h.call("CreateSnapshot"); err != nil {
		return libvirt.Snapshot{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.snaps[domain] {
		if s.Name == name {
			return libvirt.Snapshot{}, fmt.Errorf("taking snapshot %s: %w", name, libvirt.ErrSnapshotExists)
		}
	}
	if h.snaps == nil {
		h.snaps = map[string][]libvirt.Snapshot{}
	}
	s := libvirt.Snapshot{Name: name, Description: description, State: h.domains[domain], Created: time.Unix(1764687845, 0).UTC()}
	h.snaps[domain] = append(h.snaps[domain], s)
	return s, nil
}

func (h *fakeHV) Snapshots(ctx context.Context, domain string) ([]libvirt.Snapshot, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.snaps[domain]), nil
}

// RevertSnapshot does what libvirt.Client's does: for a memory snapshot,
// the definition it keeps (revertedXML when set, else the domain's) is
// checked before anything is reverted, the live one with the guest
// paused, and the guest resumed only after both pass.
func (h *fakeHV) RevertSnapshot(ctx context.Context, domain, name string, check func(string) error) error {
	if h.onRevert != nil {
		h.onRevert()
	}
	if err := h.call("RevertSnapshot"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.snaps[domain] {
		if s.Name != name {
			continue
		}
		kept := h.domXML[domain]
		if h.revertedXML != "" {
			kept = h.revertedXML
		}
		if s.Memory() {
			if err := check(kept); err != nil {
				return fmt.Errorf("refused before reverting anything: %w", err)
			}
		}
		h.domains[domain] = libvirt.StateShutoff
		h.domXML[domain] = kept
		if !s.Memory() {
			return nil
		}
		h.domains[domain] = libvirt.StatePaused
		if err := check(h.domXML[domain]); err != nil {
			return fmt.Errorf("the guest it brought back (paused, never resumed): %w", err)
		}
		h.domains[domain] = libvirt.StateRunning
		return nil
	}
	return fmt.Errorf("no snapshot %s: %w", name, libvirt.ErrNotFound)
}

func (h *fakeHV) DeleteSnapshot(ctx context.Context, domain, name string) error {
	if err := h.call("DeleteSnapshot"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, s := range h.snaps[domain] {
		if s.Name == name {
			h.snaps[domain] = slices.Delete(h.snaps[domain], i, i+1)
			return nil
		}
	}
	return fmt.Errorf("no snapshot %s: %w", name, libvirt.ErrNotFound)
}

// snapRig is a rig with instance dev created; running boots it.
func snapRig(t *testing.T, running bool) *rig {
	t.Helper()
	r := newRig(t)
	if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	if running {
		if err := r.m.Start(context.Background(), "dev"); err != nil {
			t.Fatal(err)
		}
	}
	r.hv.calls = nil
	return r
}

func TestCreateSnapshot(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	s, err := r.m.CreateSnapshot(ctx, "dev", "one", "before")
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "one" || !s.Memory() {
		t.Errorf("snapshot %+v, want one with memory", s)
	}
	if _, err := r.m.CreateSnapshot(ctx, "dev", "one", ""); !errors.Is(err, ErrSnapshotExists) || !strings.Contains(err.Error(), "abox snapshot remove dev one") {
		t.Errorf("duplicate = %v, want ErrSnapshotExists naming the fix", err)
	}
	def, err := r.m.CreateSnapshot(ctx, "dev", "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := time.Parse(SnapshotTimeFormat, def.Name); err != nil {
		t.Errorf("default name %q is not a timestamp: %v", def.Name, err)
	}
	for _, tc := range []struct {
		name, inst, snap, want string
	}{
		{"unknown instance", "nope", "x", "no such instance"},
		{"path in the name", "dev", "../x", "validating snapshot name"},
		{"xml in the name", "dev", "x</name>", "validating snapshot name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := r.m.CreateSnapshot(ctx, tc.inst, tc.snap, ""); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CreateSnapshot(%q, %q) = %v, want %q", tc.inst, tc.snap, err, tc.want)
			}
		})
	}
	delete(r.hv.domains, "abox-dev")
	if _, err := r.m.CreateSnapshot(ctx, "dev", "two", ""); err == nil || !strings.Contains(err.Error(), "recreate the instance") {
		t.Errorf("without a domain = %v", err)
	}
}

// Reverting a stopped instance to a snapshot of its running guest brings
// the layers up first: the guest never runs outside them.
func TestRevertStoppedToRunningStartsLayersFirst(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	st, _ := Load(r.m.Layout, "dev")
	if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Stop(ctx, "dev", StopOptions{}); err != nil {
		t.Fatal(err)
	}
	var layersUp bool
	r.hv.onRevert = func() {
		r.hv.mu.Lock()
		net := r.hv.networks["abox-dev"]
		r.hv.mu.Unlock()
		layersUp = net && r.fw.chains[st.Bridge] && r.d.PID("dev") != 0
	}
	r.fw.ports = nil
	res, err := r.m.RevertSnapshot(ctx, "dev", "warm")
	if err != nil {
		t.Fatal(err)
	}
	if !layersUp {
		t.Error("the guest was reverted before its network, chains and filter daemon were up")
	}
	if res.Before != libvirt.StateShutoff || res.After != libvirt.StateRunning {
		t.Errorf("states %s -> %s, want shutoff -> running", res.Before, res.After)
	}
	if len(r.fw.ports) == 0 {
		t.Error("the reverted guest's tap was not made inert outside the bridge")
	}
}

// Reverting a running guest keeps the host side as it is now: the filter
// and domain are defined again from the state, chains ensured.
func TestRevertRunningKeepsTheHostSide(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
		t.Fatal(err)
	}
	r.hv.calls = nil
	r.fw.ports = nil
	res, err := r.m.RevertSnapshot(ctx, "dev", "warm")
	if err != nil {
		t.Fatal(err)
	}
	if res.After != libvirt.StateRunning || r.d.PID("dev") == 0 {
		t.Errorf("after: %s, daemon %d", res.After, r.d.PID("dev"))
	}
	calls := r.hv.callList()
	if i := slices.Index(calls, "DefineNWFilter"); i < 0 || i > slices.Index(calls, "RevertSnapshot") {
		t.Errorf("the packet filter was not redefined before the revert: %v", calls)
	}
	if slices.Index(calls[slices.Index(calls, "RevertSnapshot"):], "DefineDomain") < 0 {
		t.Errorf("the domain was not redefined after the revert: %v", calls)
	}
	if len(r.fw.ports) == 0 {
		t.Error("the guest's tap was not ensured after the revert")
	}
}

// A revert whose definition no longer carries the instance's packet
// filter (libvirt takes it from the snapshot) is refused before the
// guest runs; one running before is powered off.
func TestRevertRefusesAnUnfilteredGuest(t *testing.T) {
	ctx := context.Background()
	for _, running := range []bool{true, false} {
		t.Run(fmt.Sprintf("running=%v", running), func(t *testing.T) {
			r := snapRig(t, true)
			if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
				t.Fatal(err)
			}
			if !running {
				if err := r.m.Stop(ctx, "dev", StopOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			r.hv.revertedXML = strings.Replace(r.hv.domXML["abox-dev"], "<filterref filter=\"abox-dev\"></filterref>", "", 1)
			if r.hv.revertedXML == r.hv.domXML["abox-dev"] {
				t.Fatalf("no filterref to take out of:\n%s", r.hv.revertedXML)
			}
			_, err := r.m.RevertSnapshot(ctx, "dev", "warm")
			// Refused before anything is reverted: a running guest is
			// powered off, a stopped one never starts.
			if err == nil || !strings.Contains(err.Error(), "packet filter") || !strings.Contains(err.Error(), "before reverting anything") ||
				strings.Contains(err.Error(), "powered off") != running {
				t.Errorf("RevertSnapshot = %v, want a refusal naming the packet filter", err)
			}
			if st := r.hv.domains["abox-dev"]; st.Active() {
				t.Errorf("the unfiltered guest is %s", st)
			}
		})
	}
}

// TestRevertRefusesAnOldDefinitionsDevices: a memory snapshot whose saved
// definition has a device the instance's definition does not (a host
// folder, as an older or edited definition could) brings it back live
// with the guest; the revert powers the guest off and fails.
func TestRevertRefusesAnOldDefinitionsDevices(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
		t.Fatal(err)
	}
	share := "<filesystem type=\"mount\"><source dir=\"/home\"></source><target dir=\"home\"></target></filesystem></devices>"
	r.hv.revertedXML = strings.Replace(r.hv.domXML["abox-dev"], "</devices>", share, 1)
	if r.hv.revertedXML == r.hv.domXML["abox-dev"] {
		t.Fatal("no </devices> to add a folder before")
	}
	_, err := r.m.RevertSnapshot(ctx, "dev", "warm")
	if err == nil || !strings.Contains(err.Error(), "<filesystem> is not allowed") || !strings.Contains(err.Error(), "powered off") {
		t.Errorf("RevertSnapshot = %v, want a refusal naming the shared folder", err)
	}
	if st := r.hv.domains["abox-dev"]; st.Active() {
		t.Errorf("the guest with a host folder is %s", st)
	}
}

// Reverting a running guest to a snapshot of the stopped one powers it off
// and stops the instance as stop does.
func TestRevertRunningToStopped(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, false)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "cold", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	res, err := r.m.RevertSnapshot(ctx, "dev", "cold")
	if err != nil {
		t.Fatal(err)
	}
	if res.Before != libvirt.StateRunning || res.After != libvirt.StateShutoff {
		t.Errorf("states %s -> %s", res.Before, res.After)
	}
	if r.d.PID("dev") != 0 || r.hv.networks["abox-dev"] {
		t.Errorf("after reverting to a stopped snapshot: daemon %d, network active %v", r.d.PID("dev"), r.hv.networks["abox-dev"])
	}
	if _, err := r.m.RevertSnapshot(ctx, "dev", "nope"); !errors.Is(err, ErrSnapshotNotFound) {
		t.Errorf("unknown snapshot = %v", err)
	}
}

// A revert that libvirt refuses leaves no guest running outside its layers.
func TestRevertFailureRollsBack(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Stop(ctx, "dev", StopOptions{}); err != nil {
		t.Fatal(err)
	}
	r.hv.failOn = "RevertSnapshot"
	if _, err := r.m.RevertSnapshot(ctx, "dev", "warm"); err == nil {
		t.Fatal("revert succeeded")
	}
	if r.d.PID("dev") != 0 || r.hv.networks["abox-dev"] || r.hv.domains["abox-dev"].Active() {
		t.Errorf("failed revert left daemon %d, network %v, domain %s", r.d.PID("dev"), r.hv.networks["abox-dev"], r.hv.domains["abox-dev"])
	}
}

func TestRemoveSnapshots(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, false)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := r.m.CreateSnapshot(ctx, "dev", n, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.m.RemoveSnapshots(ctx, "dev", []string{"a", "nope"}, false); !errors.Is(err, ErrSnapshotNotFound) {
		t.Errorf("remove with an unknown name = %v", err)
	}
	if got := len(r.hv.snaps["abox-dev"]); got != 3 {
		t.Errorf("a refused remove removed something: %d left", got)
	}
	if got, err := r.m.RemoveSnapshots(ctx, "dev", []string{"b"}, false); err != nil || !slices.Equal(got, []string{"b"}) {
		t.Errorf("remove b = %v, %v", got, err)
	}
	if got, err := r.m.RemoveSnapshots(ctx, "dev", nil, true); err != nil || !slices.Equal(got, []string{"c", "a"}) {
		t.Errorf("remove --all = %v, %v; want newest first", got, err)
	}
	if len(r.hv.snaps["abox-dev"]) != 0 {
		t.Errorf("left %v", r.hv.snaps["abox-dev"])
	}
}

// abox remove takes the snapshots with it: they live in the overlay, which
// goes with the instance directory, and libvirt's records of them go with
// the domain (UndefineDomain asks for that; see its flags).
func TestRemoveTakesTheSnapshots(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, false)
	if _, err := r.m.CreateSnapshot(ctx, "dev", "a", ""); err != nil {
		t.Fatal(err)
	}
	disk := r.m.Layout.Instance("dev").Disk
	if err := r.m.Remove(ctx, "dev", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(disk); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the overlay holding the snapshots is still there: %v", err)
	}
	if !slices.Contains(r.hv.callList(), "UndefineDomain") {
		t.Error("the domain (and with it libvirt's snapshot records) was not undefined")
	}
}

// A snapshot command on an instance another command holds (a start or stop
// in progress) says that it waits, then runs once the lock is free.
func TestSnapshotWaitsForTheInstanceLock(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	var progress syncbuf.Buffer
	r.m.Progress = &progress
	unlock, err := lockInstance(r.m.Layout, "dev") // as a running abox stop would
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.m.RevertSnapshot(ctx, "dev", "nope")
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(progress.String(), "waiting for it to finish") {
		if time.Now().After(deadline) {
			t.Fatalf("no word of waiting; progress:\n%s", progress.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("the revert ran while the lock was held: %v", err)
	default:
	}
	unlock()
	if err := <-done; !errors.Is(err, ErrSnapshotNotFound) {
		t.Errorf("after the lock was released: %v, want ErrSnapshotNotFound", err)
	}
}

// sshRun is fakeRun that records the ssh commands it is given.
type sshRun struct {
	fakeRun
	mu   sync.Mutex
	cmds []string
}

func (r *sshRun) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name != "ssh" {
		return r.fakeRun.Run(ctx, name, args...)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cmds = append(r.cmds, args[len(args)-1])
	return nil, nil
}

// A guest resumed from a snapshot's memory gets the host's time (its own
// clock resumes at the snapshot's); a disk-only revert has nothing to set.
func TestRevertSetsTheResumedGuestsClock(t *testing.T) {
	ctx := context.Background()
	r := snapRig(t, true)
	run := &sshRun{fakeRun: r.m.Run.(fakeRun)}
	r.m.Run = run
	if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Unix()
	if _, err := r.m.RevertSnapshot(ctx, "dev", "warm"); err != nil {
		t.Fatal(err)
	}
	if len(run.cmds) != 1 || !strings.HasPrefix(run.cmds[0], "sudo -n date -u -s @") {
		t.Fatalf("guest commands %q, want one that sets the clock", run.cmds)
	}
	var at int64
	if _, err := fmt.Sscanf(strings.TrimPrefix(run.cmds[0], "sudo -n date -u -s @"), "%d", &at); err != nil || at < before || at > time.Now().Unix() {
		t.Errorf("clock set to %d (%v), want the host's time", at, err)
	}
	if err := r.m.Stop(ctx, "dev", StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.m.CreateSnapshot(ctx, "dev", "cold", ""); err != nil {
		t.Fatal(err)
	}
	run.cmds = nil
	if _, err := r.m.RevertSnapshot(ctx, "dev", "cold"); err != nil {
		t.Fatal(err)
	}
	if len(run.cmds) != 0 {
		t.Errorf("a disk-only revert ran %q in the guest", run.cmds)
	}
}
