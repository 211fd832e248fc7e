//go:build e2e

package libvirt

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/abox-dev/abox/e2e/harness"
	"github.com/abox-dev/abox/internal/testutil/need"
	"libvirt.org/go/libvirtxml"
)

// TestE2ELifecycle drives a real libvirtd (socket from ABOX_LIBVIRT_SOCKET,
// else a private one started with e2e/harness) through an instance's whole life with the documents
// this package builds, and checks that libvirt accepts them, instantiates
// the nwfilter on the guest's port and cleans everything up. Run it only
// against a libvirtd inside a network namespace made for the test
// (e2e/harness does this); the guest has no bootable disk and just sits in
// the firmware, which is enough to plug its NIC into the bridge.
func TestE2ELifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	sock := os.Getenv("ABOX_LIBVIRT_SOCKET")
	var netns []string // prefix that runs a command where libvirtd's bridges are
	var env *harness.Env
	if sock == "" {
		// Never the host's libvirtd: a private one in a namespace of its own.
		need.Root(t, "a private libvirtd")
		var err error
		env, err = harness.Start(ctx, "libvirt-client", harness.Options{Logf: t.Logf})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := env.Close(context.WithoutCancel(ctx)); err != nil {
				t.Errorf("teardown: %v", err)
			}
		})
		sock = env.Socket
		netns = []string{"ip", "netns", "exec", env.Name}
	}
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Not t.TempDir: its parent is private, and QEMU runs as another user.
	dir, err := os.MkdirTemp("", "abox-libvirt-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	defer func() { t.Logf("took %v", time.Since(start)) }()
	p := testParams()
	p.Name = "e2etest"
	p.Bridge = "abx-e2etest0"
	p.DiskPath = filepath.Join(dir, "disk.qcow2")
	p.SeedISOPath = filepath.Join(dir, "seed.iso")
	p.SerialLogPath = filepath.Join(dir, "serial.log")
	// An overlay on a base, as an instance's disk is (snapshots must
	// never write the base).
	base := filepath.Join(dir, "base.qcow2")
	p.BackingPath = base // the one backing file a revert's definition may name
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "64M")
	run(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, p.DiskPath, "64M")
	if err := os.WriteFile(filepath.Join(dir, "meta-data"), []byte("instance-id: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, "genisoimage", "-quiet", "-o", p.SeedISOPath, "-volid", "cidata", "-joliet", "-rock", filepath.Join(dir, "meta-data"))

	// Owner-only files, as abox writes them (the seed may hold the guest's
	// host key): QEMU, running as another user, must still open them
	// because libvirt hands a starting domain's disks to that user.
	for _, f := range []string{p.DiskPath, p.SeedISOPath} {
		if err := os.Chmod(f, 0o600); err != nil {
			t.Fatal(err)
		}
	}

	netXML, err := NetworkXML(p)
	if err != nil {
		t.Fatal(err)
	}
	filterXML, err := NWFilterXML(p)
	if err != nil {
		t.Fatal(err)
	}
	domXML, err := DomainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	dom, nw, filt := DomainName(p.Name), NetworkName(p.Name), FilterName(p.Name)
	cleanup := func() {
		// Best effort, in reverse order, so a failed run leaves nothing.
		c.DestroyDomain(context.Background(), dom)
		c.UndefineDomain(context.Background(), dom)
		c.UndefineNWFilter(context.Background(), filt)
		c.DestroyNetwork(context.Background(), nw)
		c.UndefineNetwork(context.Background(), nw)
	}
	cleanup()
	t.Cleanup(cleanup)

	for i := 0; i < 2; i++ { // twice: everything must be idempotent
		must(t, c.DefineNetwork(ctx, netXML))
		must(t, c.StartNetwork(ctx, nw))
		must(t, c.DefineNWFilter(ctx, filterXML))
		must(t, c.DefineDomain(ctx, domXML))
		must(t, c.StartDomain(ctx, dom))
	}
	st, err := c.State(ctx, dom)
	if err != nil || st != StateRunning {
		t.Fatalf("state = %v, %v; want running", st, err)
	}

	// The persistent definition libvirt stored still carries the filter.
	lv := c.r.(*golibvirt.Libvirt)
	d, err := lv.DomainLookupByName(dom)
	if err != nil {
		t.Fatal(err)
	}
	inactive, err := lv.DomainGetXMLDesc(d, golibvirt.DomainXMLInactive)
	if err != nil {
		t.Fatal(err)
	}
	var def libvirtxml.Domain
	if err := def.Unmarshal(inactive); err != nil {
		t.Fatal(err)
	}
	if f := def.Devices.Interfaces[0].FilterRef; f == nil || f.Filter != filt {
		t.Errorf("stored definition's NIC filterref = %+v, want %s", f, filt)
	}
	if def.Metadata == nil || !strings.Contains(def.Metadata.XML, MetadataNamespace) {
		t.Errorf("stored metadata = %+v", def.Metadata)
	}
	live, err := lv.DomainGetXMLDesc(d, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ld libvirtxml.Domain
	if err := ld.Unmarshal(live); err != nil {
		t.Fatal(err)
	}
	port := ld.Devices.Interfaces[0].Target.Dev
	t.Logf("guest port %s on %s", port, p.Bridge)

	// The filter is instantiated on the port, both layers.
	inNS := func(args ...string) string {
		a := append(append([]string{}, netns...), args...)
		return output(t, a[0], a[1:]...)
	}
	eb := inNS("ebtables", "-t", "nat", "-L")
	for _, want := range []string{"-p IPv4 -s 52:54:00:ab:cd:ef --ip-src 10.10.5.10 -j ACCEPT", "-p IPv6 -j DROP", "-p ARP -s 52:54:00:ab:cd:ef --arp-ip-src 10.10.5.10 --arp-mac-src 52:54:00:ab:cd:ef -j ACCEPT", "-p IPv4 --ip-dst 10.10.5.10 -j ACCEPT"} {
		if !strings.Contains(eb, want) {
			t.Errorf("ebtables lacks %q:\n%s", want, eb)
		}
	}
	ipt := inNS("iptables", "-S")
	for _, want := range []string{"--dport 8080", "--dport 53", "--icmp-type 8", "-j DROP"} {
		if !strings.Contains(ipt, want) {
			t.Errorf("iptables lacks %q:\n%s", want, ipt)
		}
	}
	// libvirt made the bridge without the kernel's STP, which would take
	// the guest's BPDUs before ebtables (TestE2EBridgeIgnoresGuestBPDUs).
	if got := strings.TrimSpace(inNS("cat", "/sys/class/net/"+p.Bridge+"/bridge/stp_state")); got != "0" {
		t.Errorf("bridge %s stp_state = %s, want 0", p.Bridge, got)
	}
	ip6 := inNS("ip6tables", "-S")
	if !strings.Contains(ip6, port) {
		t.Errorf("ip6tables has no rules for %s:\n%s", port, ip6)
	}
	t.Logf("ebtables:\n%s\niptables:\n%s\nip6tables:\n%s", eb, ipt, ip6)

	snapshotLifecycle(t, ctx, c, p, base, env)

	// The guest never boots an OS, so ACPI shutdown is ignored: destroy.
	must(t, c.ShutdownDomain(ctx, dom))
	must(t, c.DestroyDomain(ctx, dom))
	must(t, c.WaitShutoff(ctx, dom, 200*time.Millisecond))
	for i := 0; i < 2; i++ {
		must(t, c.DestroyDomain(ctx, dom))
		must(t, c.UndefineDomain(ctx, dom))
		must(t, c.UndefineNWFilter(ctx, filt))
		must(t, c.DestroyNetwork(ctx, nw))
		must(t, c.UndefineNetwork(ctx, nw))
	}
	if _, err := c.State(ctx, dom); !errors.Is(err, ErrNotFound) {
		t.Errorf("domain still there: %v", err)
	}
	if ok, _ := c.NWFilterExists(ctx, filt); ok {
		t.Error("nwfilter still there")
	}
	if _, err := c.NetworkActive(ctx, nw); !errors.Is(err, ErrNotFound) {
		t.Errorf("network still there: %v", err)
	}
	if env != nil {
		// UndefineDomain took libvirt's records of the snapshot "left".
		if _, err := os.Stat(filepath.Join(env.Dir, "lib", "qemu", "snapshot", dom)); !os.IsNotExist(err) {
			t.Errorf("snapshot records of %s left behind: %v", dom, err)
		}
	}
}

// snapshotLifecycle takes, reverts to and deletes snapshots of the running
// firmware-only guest of TestE2ELifecycle (no OS: its memory is small, so
// this costs seconds) and of the stopped domain, and leaves one snapshot,
// "left", for the undefine that follows to take with the domain.
func snapshotLifecycle(t *testing.T, ctx context.Context, c *Client, p Params, base string, env *harness.Env) {
	dom := DomainName(p.Name)
	state := func(want DomainState) {
		t.Helper()
		if st, err := c.State(ctx, dom); err != nil || st != want {
			t.Fatalf("domain is %s (%v), want %s", st, err, want)
		}
	}
	timed := func(what string, f func() error) {
		t.Helper()
		t0 := time.Now()
		err := f()
		t.Logf("FIGURE %s: %s", what, time.Since(t0).Round(10*time.Millisecond))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var warm Snapshot
	timed("snapshot-create-running (firmware guest)", func() (err error) {
		warm, err = c.CreateSnapshot(ctx, dom, "warm", "firmware & all")
		return err
	})
	if warm.State != StateRunning || !warm.Current || warm.Description != "firmware & all" || warm.Created.IsZero() {
		t.Errorf("warm = %+v", warm)
	}
	if _, err := c.CreateSnapshot(ctx, dom, "warm", ""); !errors.Is(err, ErrSnapshotExists) {
		t.Errorf("a second warm = %v, want ErrSnapshotExists", err)
	}
	// The definitions a real libvirt keeps in a snapshot and runs after
	// a revert (aliases, addresses, labels, the tap, the backing chain)
	// pass the check a revert makes.
	wantDef, err := BuildDomain(p)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	check := func(doc string) error {
		checked++
		err := CheckDevices(doc, p, wantDef)
		if err != nil {
			t.Logf("refused definition:\n%s", doc)
		}
		return err
	}
	timed("snapshot-revert-running-to-running", func() error { return c.RevertSnapshot(ctx, dom, "warm", check) })
	state(StateRunning)
	if checked < 2 {
		t.Errorf("the revert checked %d definitions, want the snapshot's and the live one", checked)
	}
	must(t, c.DestroyDomain(ctx, dom))
	timed("snapshot-create-stopped", func() error {
		_, err := c.CreateSnapshot(ctx, dom, "cold", "")
		return err
	})
	timed("snapshot-revert-stopped-to-running", func() error { return c.RevertSnapshot(ctx, dom, "warm", check) })
	state(StateRunning)
	timed("snapshot-revert-running-to-stopped", func() error { return c.RevertSnapshot(ctx, dom, "cold", check) })
	state(StateShutoff)
	list, err := c.Snapshots(ctx, dom)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "warm" || list[1].Name != "cold" || list[1].State != StateShutoff || !list[1].Current || list[0].Current {
		t.Errorf("Snapshots = %+v", list)
	}
	if out := output(t, "qemu-img", "snapshot", "-l", "-U", p.DiskPath); !strings.Contains(out, "warm") || !strings.Contains(out, "cold") {
		t.Errorf("the overlay's snapshot table:\n%s", out)
	}
	if out := output(t, "qemu-img", "snapshot", "-l", "-U", base); strings.TrimSpace(out) != "" {
		t.Errorf("the base image has snapshots:\n%s", out)
	}
	for _, n := range []string{"warm", "cold"} {
		must(t, c.DeleteSnapshot(ctx, dom, n))
	}
	if err := c.DeleteSnapshot(ctx, dom, "cold"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleting cold twice = %v, want ErrNotFound", err)
	}
	if out := output(t, "qemu-img", "snapshot", "-l", "-U", p.DiskPath); strings.TrimSpace(out) != "" {
		t.Errorf("deleted snapshots are still in the overlay:\n%s", out)
	}
	must(t, c.StartDomain(ctx, dom))
	if _, err := c.CreateSnapshot(ctx, dom, "left", ""); err != nil {
		t.Fatal(err)
	}
	if env != nil {
		if _, err := os.Stat(filepath.Join(env.Dir, "lib", "qemu", "snapshot", dom, "left.xml")); err != nil {
			t.Errorf("libvirt's record of snapshot left is not where the test looks: %v", err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	t.Logf("%s step done", time.Now().Format("15:04:05.000"))
	if err != nil {
		t.Fatal(err)
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func output(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}
