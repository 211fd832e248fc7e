package instance

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

// validState fills in what a test's state leaves out as create would, so
// that Load (which validates) accepts it.
func validState(s State) State {
	s.UUID, s.MAC, s.Accel, s.CPUs, s.MemoryMiB = "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50", "52:54:00:ab:cd:ef", "tcg", 1, 1024
	if s.ProxyPort == 0 {
		s.ProxyPort = DefaultProxyPort
	}
	s.Subnet = netip.PrefixFrom(s.Gateway, 24).Masked()
	s.GuestIP = s.Subnet.Addr().Next().Next()
	if s.GuestIP == s.Gateway {
		s.GuestIP = s.GuestIP.Next()
	}
	s.Bridge, _ = validate.BridgeName(s.Name)
	return s
}

// TestLoadValidatesState: a state file that was edited or corrupted into
// something abox never writes (an iptables argument as the bridge, a host
// path as the kernel) is refused with the way out named.
func TestLoadValidatesState(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	good := validState(State{Name: "dev", Gateway: netip.MustParseAddr("10.10.3.1")})
	for _, tt := range []struct {
		name string
		mod  func(*State)
		want string
	}{
		{"good", func(*State) {}, ""},
		{"bridge with iptables arguments", func(s *State) { s.Bridge = "eth0 -j ACCEPT" }, "bridge"},
		{"another instance's bridge", func(s *State) { s.Bridge = "abx-0123456789a" }, "want"},
		{"subnet not a /24", func(s *State) { s.Subnet = netip.MustParsePrefix("10.0.0.0/8") }, "subnet"},
		{"gateway outside the subnet", func(s *State) { s.Gateway = netip.MustParseAddr("192.168.1.1") }, "gateway"},
		{"kernel outside the image store", func(s *State) { s.Kernel = "/etc/shadow" }, "kernel"},
		{"upstream CA elsewhere", func(s *State) { s.UpstreamCA = "/etc/ssl/private/key.pem" }, "upstream CA"},
		{"accel", func(s *State) { s.Accel = "xen" }, "accel"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.mod(&s)
			os.MkdirAll(l.InstanceDir("dev"), 0o700)
			if err := Save(l, s); err != nil {
				t.Fatal(err)
			}
			_, err := Load(l, "dev")
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Load = %v", err)
				}
				return
			}
			if !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "abox remove --force dev") {
				t.Errorf("Load = %v, want ErrDamaged naming %q and the fix", err, tt.want)
			}
		})
	}
}

// TestRemoveForceCleansDamaged: a damaged state refuses start and a plain
// remove with the way out named; remove --force still removes every
// libvirt object and the chains, found by the instance name alone.
func TestRemoveForceCleansDamaged(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	r.fw.Ensure(ctx, FirewallBridge(st))
	f := r.m.Layout.Instance("dev")
	if err := os.WriteFile(f.State, []byte(`{"name": "dev", "bridge": "eth0 -j ACCEPT"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.m.Start(ctx, "dev"); !errors.Is(err, ErrDamaged) {
		t.Errorf("Start of a damaged instance = %v, want ErrDamaged", err)
	}
	if err := r.m.Remove(ctx, "dev", false); !errors.Is(err, ErrDamaged) {
		t.Errorf("Remove without --force = %v, want ErrDamaged", err)
	}
	r.hv.calls = nil
	if err := r.m.Remove(ctx, "dev", true); err != nil {
		t.Fatalf("Remove --force = %v", err)
	}
	calls := strings.Join(r.hv.callList(), " ")
	for _, want := range []string{"UndefineDomain", "UndefineNWFilter", "UndefineNetwork"} {
		if !strings.Contains(calls, want) {
			t.Errorf("Remove --force calls %q, want %s", calls, want)
		}
	}
	if r.fw.chains[st.Bridge] {
		t.Errorf("chains of %s still there", st.Bridge)
	}
	if _, err := os.Stat(f.Dir); err == nil {
		t.Errorf("directory still there")
	}
	// A name with nothing left: not found, after cleaning any leftovers.
	if err := r.m.Remove(ctx, "dev", true); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Remove --force = %v, want ErrNotFound", err)
	}
	if _, err := os.Stat(f.Dir); err == nil {
		t.Errorf("remove of a missing instance created its directory")
	}
}

// TestDamagedInstanceDoesNotBlockOthers: list shows a damaged instance as
// such, and create still works.
func TestDamagedInstanceDoesNotBlockOthers(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, Spec{Name: "bad", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.m.Layout.Instance("bad").State, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.m.Create(ctx, Spec{Name: "good", Accel: "tcg"}); err != nil {
		t.Fatalf("create next to a damaged instance = %v", err)
	}
	infos, err := r.m.List(ctx)
	if err != nil || len(infos) != 2 || infos[0].Name != "bad" || infos[0].Status != "damaged" || infos[1].Name != "good" {
		t.Errorf("List = %+v, %v; want bad (damaged) and good", infos, err)
	}
}
