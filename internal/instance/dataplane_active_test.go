package instance

import (
	"net/netip"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestDataPlaneStartsActive: the per-instance daemon's configuration never
// asks for passive mode, whatever the instance's state: a daemon started or
// restarted by start, the supervisor or a reboot enforces the allowlist
// until someone switches it with abox mode.
func TestDataPlaneStartsActive(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	for _, st := range []State{
		{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128},
		{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128, NoMITM: true, AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}},
	} {
		if cfg := DataPlane(l, st, nil, nil); cfg.Passive {
			t.Errorf("DataPlane(%+v) starts passive", st)
		}
	}
}

// TestDataPlaneAddressPermits: --allow-private and --allow-host reach the
// daemon as two lists, so the first never opens what only the second may.
func TestDataPlaneAddressPermits(t *testing.T) {
	st := State{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128,
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")},
		AllowHost:    []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	cfg := DataPlane(paths.Layout{Root: t.TempDir()}, st, nil, nil)
	if len(cfg.AllowPrivate) != 1 || cfg.AllowPrivate[0] != st.AllowPrivate[0] || len(cfg.AllowHost) != 1 || cfg.AllowHost[0] != st.AllowHost[0] {
		t.Errorf("daemon config allow_private %v allow_host %v, want %v and %v", cfg.AllowPrivate, cfg.AllowHost, st.AllowPrivate, st.AllowHost)
	}
}
