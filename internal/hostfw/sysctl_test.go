package hostfw

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The tests of this file hold Ensure to the kernel switches it needs: bridge
// netfilter (for libvirt's nwfilter) and the ARP switches.

// bridgeNFDir makes a stand-in for /proc/sys/net/bridge with the iptables
// and ip6tables switches set to v4 and v6.
func bridgeNFDir(t *testing.T, v4, v6 string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bridge")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"bridge-nf-call-iptables": v4, "bridge-nf-call-ip6tables": v6} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// modprobeRunner answers modprobe itself (loading "the module" creates the
// switches, both on, unless fail) and passes everything else on.
type modprobeRunner struct {
	Runner
	dir   string
	fail  bool
	calls []string
}

func (m *modprobeRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name != "modprobe" {
		return m.Runner.Run(ctx, name, args...)
	}
	m.calls = append(m.calls, name+" "+strings.Join(args, " "))
	if m.fail {
		return nil, exitErr(1)
	}
	if err := os.Mkdir(m.dir, 0o755); err != nil {
		return nil, err
	}
	for _, f := range bridgeNFSwitches {
		if err := os.WriteFile(filepath.Join(m.dir, f), []byte("1\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return nil, nil
}

// TestEnsureRequiresBridgeNetfilter: libvirt's nwfilter IP rules only see
// bridged traffic through br_netfilter, so Ensure (run before every boot)
// loads the module when it is missing and refuses, before touching any
// chain, when a switch is off; Check reports it.
func TestEnsureRequiresBridgeNetfilter(t *testing.T) {
	ctx := context.Background()
	t.Run("on", func(t *testing.T) {
		m := &modprobeRunner{Runner: newFakeTables()}
		fw := New(m)
		fw.bridgeNF = bridgeNFDir(t, "1", "1")
		if err := fw.Ensure(ctx, bb); err != nil {
			t.Fatal(err)
		}
		if len(m.calls) != 0 {
			t.Errorf("modprobe ran although the switches are on: %q", m.calls)
		}
	})
	t.Run("module missing is loaded", func(t *testing.T) {
		tables := newFakeTables()
		m := &modprobeRunner{Runner: tables, dir: filepath.Join(t.TempDir(), "bridge")}
		fw := New(m)
		fw.bridgeNF = m.dir
		if st, err := fw.Check(ctx, bb); err != nil || !strings.Contains(strings.Join(st.Problems, "\n"), "br_netfilter not loaded") {
			t.Errorf("Check = %q, %v; want the missing module reported", st.Problems, err)
		}
		if err := fw.Ensure(ctx, bb); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(m.calls, []string{"modprobe br_netfilter"}) {
			t.Errorf("modprobe calls = %q, want one modprobe br_netfilter", m.calls)
		}
		if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
			t.Errorf("Check after Ensure = %q, %v; want intact", st.Problems, err)
		}
	})
	for _, tt := range []struct {
		name     string
		v4, v6   string
		noModule bool
		want     string
	}{
		{name: "iptables switch off", v4: "0", v6: "1", want: "bridge-nf-call-iptables = 0"},
		{name: "ip6tables switch off", v4: "1", v6: "0", want: "bridge-nf-call-ip6tables = 0"},
		{name: "module cannot be loaded", noModule: true, want: "loading br_netfilter"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tables := newFakeTables()
			m := &modprobeRunner{Runner: tables, dir: filepath.Join(t.TempDir(), "bridge"), fail: true}
			fw := New(m)
			fw.bridgeNF = m.dir
			if !tt.noModule {
				fw.bridgeNF = bridgeNFDir(t, tt.v4, tt.v6)
			}
			err := fw.Ensure(ctx, bb)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Ensure = %v, want an error containing %q", err, tt.want)
			}
			if len(tables.log) != 0 {
				t.Errorf("Ensure touched the tables although it refused: %q", tables.log)
			}
			if !tt.noModule && len(m.calls) != 0 {
				t.Errorf("modprobe ran although the module is loaded: %q", m.calls)
			}
			if st, err := fw.Check(ctx, bb); err != nil || st.Intact() {
				t.Errorf("Check = %+v, %v; want not intact", st, err)
			}
		})
	}
}

// TestEnsureSetsARPSwitches: the host answers the guest's ARP only for the
// gateway (arp_ignore=1 on the bridge), Check reports the switches when
// they are off (a bridge libvirt recreated has the defaults again) and
// Ensure repairs them.
func TestEnsureSetsARPSwitches(t *testing.T) {
	ctx := context.Background()
	tables := newFakeTables()
	fw := testFirewall(t, tables)
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"arp_ignore": "1", "arp_announce": "2"} {
		if got := tables.sysctl["net/ipv4/conf/"+br+"/"+name]; got != want {
			t.Errorf("%s = %q, want %s", name, got, want)
		}
	}
	tables.sysctl["net/ipv4/conf/"+br+"/arp_ignore"] = "0"
	st, err := fw.Check(ctx, bb)
	if err != nil || len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "arp_ignore = 0") {
		t.Errorf("Check with arp_ignore reset = %q, %v; want it reported", st.Problems, err)
	}
	if err := fw.Ensure(ctx, bb); err != nil {
		t.Fatal(err)
	}
	if st, err := fw.Check(ctx, bb); err != nil || !st.Intact() {
		t.Errorf("Check after repair = %q, %v", st.Problems, err)
	}
}
