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
