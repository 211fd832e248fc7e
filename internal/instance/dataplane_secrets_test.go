package instance

import (
	"net/netip"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestDataPlaneSecrets: every instance's proxy reads the host's one secret
// store, outside the instance directory, so that an instance with bindings
// gets its values injected and its placeholders refused elsewhere.
func TestDataPlaneSecrets(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	st := State{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128}
	if cfg := DataPlane(l, st, nil, nil); cfg.HTTP == nil || cfg.HTTP.SecretsDir != l.Secrets() {
		t.Errorf("DataPlane: secrets dir %q, want the store %q", cfg.HTTP.SecretsDir, l.Secrets())
	}
}
