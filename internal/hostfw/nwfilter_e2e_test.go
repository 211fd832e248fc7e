//go:build e2e

package hostfw

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/harness"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestE2ENWFilterRulesChecked binds abox's real nwfilter to two ports
// (veths standing for taps, named so that one is a prefix of the other)
// with a private libvirtd in a namespace of its own, and flushes the
// kernel rules libvirt made for them: CheckNWFilter passes with them in
// place, names what a flush of ebtables' nat table and of iptables' filter
// table takes away (while libvirt still lists the binding), and passes
// again after each repair NWFilterFix names (the binding created again;
// libvirtd reloaded). With -update it records the tools' listings of the
// intact rules in testdata/ for the unit test.
func TestE2ENWFilterRulesChecked(t *testing.T) {
	need.Root(t, "a private libvirtd")
	for _, tool := range []string{"libvirtd", "virsh", "ip", "iptables", "ip6tables", "ebtables"} {
		need.Program(t, tool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := harness.Start(ctx, "hostfw-nwf", harness.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Close(context.WithoutCancel(ctx)); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	r := nsRunner{env.Name}
	sh := func(name string, args ...string) string {
		t.Helper()
		out, err := r.Run(ctx, name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	virsh := func(args ...string) string {
		t.Helper()
		out, err := env.Virsh(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	const bridge = "abx-nwftest0"
	taps := []string{"vnwf1", "vnwf10"}
	sh("ip", "link", "add", bridge, "type", "bridge")
	sh("ip", "link", "set", bridge, "up")
	for _, tap := range taps {
		sh("ip", "link", "add", tap, "type", "veth", "peer", "name", tap+"p")
		sh("ip", "link", "set", tap, "master", bridge, "up")
	}

	dir := filepath.Join(env.Dir, "tmp")
	p := libvirt.Params{
		Name: "nwftest", UUID: "0b0e4d4c-7d1a-4c8e-9d55-3c5f0c2b6a01", Bridge: bridge,
		Subnet: netip.MustParsePrefix("10.99.8.0/24"), Gateway: netip.MustParseAddr("10.99.8.1"), GuestIP: netip.MustParseAddr("10.99.8.10"),
		MAC: "52:54:00:aa:bb:08", ProxyPort: 28128, CPUs: 1, MemoryMiB: 256, Accel: libvirt.AccelTCG,
		DiskPath: "/nonexistent/disk.qcow2", SeedISOPath: "/nonexistent/seed.iso", SerialLogPath: "/nonexistent/serial.log",
	}
	filterXML, err := libvirt.NWFilterXML(p)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, s string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	virsh("nwfilter-define", write("filter.xml", filterXML))
	for i, tap := range taps {
		virsh("nwfilter-binding-create", write(tap+".xml", fmt.Sprintf(`<filterbinding>
  <owner><name>abox-nwftest</name><uuid>%s</uuid></owner>
  <portdev name=%q/>
  <mac address="52:54:00:aa:bb:0%d"/>
  <filterref filter=%q/>
</filterbinding>
`, p.UUID, tap, 8+i, libvirt.FilterName(p.Name))))
	}

	fw := New(r)
	check := func(stage, tap string, want ...string) {
		t.Helper()
		st, err := fw.CheckNWFilter(ctx, tap)
		if err != nil {
			t.Fatalf("%s: CheckNWFilter(%s): %v", stage, tap, err)
		}
		got := strings.Join(st.Problems, "\n")
		if len(want) == 0 && !st.Intact() {
			t.Errorf("%s: CheckNWFilter(%s) = %q, want intact", stage, tap, st.Problems)
		}
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: CheckNWFilter(%s) = %q, want a problem naming %q", stage, tap, st.Problems, w)
			}
		}
	}
	intact := func(stage string) {
		t.Helper()
		for _, tap := range taps {
			check(stage, tap)
		}
	}
	intact("bound")
	check("no binding", "vnwf2", "nat PREROUTING jump to libvirt-I-vnwf2 missing", "iptables: filter chain FI-vnwf2 missing", "ip6tables: filter chain HI-vnwf2 missing")
	if *update {
		for name, cmd := range map[string][]string{
			"nwfilter-ebtables.txt":  {"ebtables", "-t", "nat", "-L"},
			"nwfilter-iptables.txt":  {"iptables", "-w", "10", "-t", "filter", "-S"},
			"nwfilter-ip6tables.txt": {"ip6tables", "-w", "10", "-t", "filter", "-S"},
		} {
			if err := os.WriteFile(filepath.Join("testdata", name), []byte(sh(cmd[0], cmd[1:]...)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}

	bound := func() {
		t.Helper()
		for _, tap := range taps {
			if out := virsh("nwfilter-binding-list"); !strings.Contains(out, tap) {
				t.Fatalf("libvirt no longer lists the binding of %s:\n%s", tap, out)
			}
		}
	}
	sh("ebtables", "-t", "nat", "-F")
	bound()
	check("ebtables -t nat -F", "vnwf1", "nat PREROUTING jump to libvirt-I-vnwf1 missing", "nat chain libvirt-O-vnwf1 is empty")
	if st, _ := fw.CheckNWFilter(ctx, "vnwf1"); strings.Contains(strings.Join(st.Problems, " "), "iptables") {
		t.Errorf("an ebtables flush reported as iptables problems: %q", st.Problems)
	}
	sh("iptables", "-w", "10", "-F")
	sh("ip6tables", "-w", "10", "-F")
	bound()
	check("iptables -F", "vnwf1", "iptables: filter FORWARD jump to libvirt-in missing", "iptables: filter chain FI-vnwf1 is empty", "ip6tables: filter chain HI-vnwf1 is empty")

	// The repairs NWFilterFix names. Creating the binding again rebuilds
	// its rules only: the other tap's stay missing.
	tap := taps[0]
	x := virsh("nwfilter-binding-dumpxml", tap)
	virsh("nwfilter-binding-delete", tap)
	virsh("nwfilter-binding-create", write("again.xml", x))
	check("binding created again", tap)
	check("other binding untouched", taps[1], "libvirt-I-"+taps[1])

	b, err := os.ReadFile(filepath.Join(env.Dir, "libvirtd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st0, err0 := fw.CheckNWFilter(ctx, taps[0])
		st1, err1 := fw.CheckNWFilter(ctx, taps[1])
		if err0 == nil && err1 == nil && st0.Intact() && st1.Intact() {
			break
		}
		if time.Now().After(deadline) {
			intact("libvirtd reloaded")
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, tap := range taps {
		virsh("nwfilter-binding-delete", tap)
	}
	virsh("nwfilter-undefine", libvirt.FilterName(p.Name))
}
