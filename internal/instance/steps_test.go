package instance

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/steps"
)

var errInjected = errors.New("injected before the step")

// stepsOf records the names of the steps an operation ran, in order.
func stepsOf(m *Manager) *[]string {
	var names []string
	m.OnStep = func(ev steps.Event) {
		if ev.Phase == steps.Started {
			names = append(names, ev.Step)
		}
	}
	return &names
}

// failBefore makes the step named step fail before it does anything.
func failBefore(m *Manager, step string) {
	m.faultBefore = func(s string) error {
		if s == step {
			return errInjected
		}
		return nil
	}
}

// assertNoInstance checks that nothing of instance name is left: no
// directory, no listing, no libvirt object, nothing under instances/.
func assertNoInstance(t *testing.T, r *rig, name string) {
	t.Helper()
	if _, err := os.Stat(r.m.Layout.Instance(name).Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance directory left behind: %v", err)
	}
	if sts, _ := ListStates(r.m.Layout); len(sts) != 0 && sts[len(sts)-1].Name == name {
		t.Errorf("%s listed after a failed operation", name)
	}
	r.hv.mu.Lock()
	defer r.hv.mu.Unlock()
	for n := range r.hv.networks {
		if strings.HasSuffix(n, name) {
			t.Errorf("network %s left behind", n)
		}
	}
	for n := range r.hv.filters {
		if strings.HasSuffix(n, name) {
			t.Errorf("nwfilter %s left behind", n)
		}
	}
	for n := range r.hv.domains {
		if strings.HasSuffix(n, name) {
			t.Errorf("domain %s left behind", n)
		}
	}
}

// assertUnlocked fails when a lock file is held (by this process too:
// flock locks belong to the open file, not the process).
func assertUnlocked(t *testing.T, path string) {
	t.Helper()
	fh, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("%s is still locked after the operation returned: %v", path, err)
	}
	syscall.Flock(int(fh.Fd()), syscall.LOCK_UN)
}

// A create that fails at any of its steps leaves nothing behind and
// releases the global lock: the same create then succeeds.
func TestCreateFailingAtEveryStepLeavesNothing(t *testing.T) {
	probe := newRig(t)
	names := stepsOf(probe.m)
	if _, _, err := probe.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	if len(*names) < 10 {
		t.Fatalf("create ran the steps %v; want its whole list", *names)
	}
	for _, step := range *names {
		t.Run(step, func(t *testing.T) {
			r := newRig(t)
			failBefore(r.m, step)
			_, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"})
			var se *steps.Error
			if !errors.Is(err, errInjected) || !errors.As(err, &se) || se.Step != step || !strings.HasPrefix(err.Error(), "creating dev: ") {
				t.Fatalf("create = %v, want the injected failure at %q, prefixed once", err, step)
			}
			assertNoInstance(t, r, "dev")
			if ents, _ := os.ReadDir(r.m.Layout.Instances()); len(ents) != 0 {
				t.Errorf("a failed create left %v in the instances directory", ents)
			}
			assertUnlocked(t, filepath.Join(r.m.Layout.Root, ".lock"))
			r.m.faultBefore = nil
			if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"}); err != nil {
				t.Errorf("create after the failure: %v", err)
			}
		})
	}
}

// An undo that fails is reported with the cause, and the other undos
// still run.
func TestCreateReportsAFailedUndo(t *testing.T) {
	r := newRig(t)
	failBefore(r.m, "save the state")
	r.hv.failOn = "UndefineNWFilter"
	_, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"})
	if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), "rolling back: undo define the packet filter: UndefineNWFilter: injected failure") {
		t.Fatalf("create = %v, want the cause and the failed undo", err)
	}
	if len(r.hv.domains)+len(r.hv.networks) != 0 {
		t.Errorf("the other undos did not run: domains %v networks %v", r.hv.domains, r.hv.networks)
	}
	if _, err := os.Stat(r.m.Layout.Instance("dev").Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("instance directory left behind: %v", err)
	}
}

// A cancelled create stops before its next step and undoes the ones done.
func TestCreateCancelledLeavesNothing(t *testing.T) {
	r := newRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	r.m.faultBefore = func(s string) error {
		if s == "disk overlay" {
			cancel()
		}
		return nil
	}
	_, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("create = %v, want it cancelled", err)
	}
	assertNoInstance(t, r, "dev")
}

// Typed refusals: the facts, for the CLI to advise on.
func TestCreateRefusalsAreTyped(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var base *BaseMissingError
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Base: "nope"}); !errors.As(err, &base) || base.Base != "nope" {
		t.Errorf("create on a missing base = %v, want a BaseMissingError of nope", err)
	}
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	var taken *NameTakenError
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); !errors.As(err, &taken) || taken.Name != "dev" || taken.Import {
		t.Errorf("second create = %v, want a NameTakenError of dev", err)
	}
	r.hv.domains["abox-web"] = libvirt.StateShutoff
	var dom *DomainTakenError
	if _, _, err := r.m.Create(ctx, Spec{Name: "web", Accel: "tcg"}); !errors.As(err, &dom) || dom.Domain != "abox-web" {
		t.Errorf("create over a foreign domain = %v, want a DomainTakenError of abox-web", err)
	}
	st, _ := Load(r.m.Layout, "dev")
	var inUse *SubnetInUseError
	if _, _, err := r.m.Create(ctx, Spec{Name: "other", Accel: "tcg", Subnet: st.Subnet}); !errors.As(err, &inUse) || inUse.Subnet != st.Subnet {
		t.Errorf("create on dev's subnet = %v, want a SubnetInUseError of %s", err, st.Subnet)
	}
}

// An import that fails at any of its steps leaves nothing behind: no
// instance, no staging directory, no libvirt object, and no monitor
// bundle in the agent cache that was not there before.
func TestImportFailingAtEveryStepLeavesNothing(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, fullSpec(t)); err != nil {
		t.Fatal(err)
	}
	src, err := Load(r.m.Layout, "dev")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dev.abox")
	if _, err := r.m.Export(ctx, "dev", out); err != nil {
		t.Fatal(err)
	}
	creds := hostCredentials(t)
	opts := ImportOptions{Name: "dev2", Trust: true, UpstreamProxyCredentials: creds}
	// The import adds the bundle to the cache, so its undo has work.
	bundle := src.MonitorBundle.Path
	if err := os.Remove(bundle); err != nil {
		t.Fatal(err)
	}
	names := stepsOf(r.m)
	if _, _, err := r.m.Import(ctx, out, opts); err != nil {
		t.Fatal(err)
	}
	list := append([]string(nil), *names...)
	r.m.OnStep = nil
	if err := r.m.Remove(ctx, "dev2", true); err != nil {
		t.Fatal(err)
	}
	for _, step := range list {
		t.Run(step, func(t *testing.T) {
			os.Remove(bundle)
			failBefore(r.m, step)
			defer func() { r.m.faultBefore = nil }()
			_, _, err := r.m.Import(ctx, out, opts)
			var se *steps.Error
			if !errors.Is(err, errInjected) || !errors.As(err, &se) || se.Step != step {
				t.Fatalf("import = %v, want the injected failure at %q", err, step)
			}
			assertNothingLeft(t, r, "dev2")
			assertUnlocked(t, filepath.Join(r.m.Layout.Root, ".lock"))
			assertNoInstance(t, r, "dev2")
			if _, err := os.Stat(bundle); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the failed import left its monitor bundle in the agent cache: %v", err)
			}
		})
	}
}

// A running guest replaced by a memory snapshot does not run on when the
// host chains or its tap cannot be ensured: the replace step's undo
// powers it off, and the error names the layer.
func TestRevertUnguardedGuestIsPoweredOff(t *testing.T) {
	ctx := context.Background()
	for _, layer := range []string{"host firewall", "the guest's tap"} {
		t.Run(layer, func(t *testing.T) {
			r := snapRig(t, true)
			if _, err := r.m.CreateSnapshot(ctx, "dev", "warm", ""); err != nil {
				t.Fatal(err)
			}
			if layer == "host firewall" {
				r.fw.fail = true
			} else {
				r.fw.failPort = true
			}
			names := stepsOf(r.m)
			_, err := r.m.RevertSnapshot(ctx, "dev", "warm")
			var se *steps.Error
			if !errors.As(err, &se) || se.Step != layer || !strings.HasPrefix(err.Error(), "reverting dev to snapshot warm: "+layer+": ") || !strings.HasSuffix(err.Error(), "(the guest was powered off)") {
				t.Fatalf("revert = %v, want a failure of step %q", err, layer)
			}
			if st := r.hv.domains["abox-dev"]; st.Active() {
				t.Errorf("the guest without its %s is %s", layer, st)
			}
			if !slices.Contains(*names, "replace the running guest") {
				t.Errorf("steps %v: want the running guest replaced", *names)
			}
		})
	}
}
