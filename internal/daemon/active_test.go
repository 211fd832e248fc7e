package daemon

import (
	"context"
	"net/http"
	"testing"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/policy"
)

// TestStartsActive: a data plane whose Config does not ask for passive mode
// enforces the allowlist from its first query: a name the upstream knows but
// the allowlist lacks is refused by both filters, and the API says active.
// (The instance daemon relies on this: a restarted daemon comes back
// active; see instance.TestDataPlaneStartsActive.)
func TestStartsActive(t *testing.T) {
	p := startPlane(t)
	p.up.Add("unlisted.test. 60 IN A 127.0.0.1")
	if rc := p.query(t, "unlisted.test."); rc != dns.RcodeNameError {
		t.Errorf("unlisted name: rcode %s, want NXDOMAIN", dns.RcodeToString[rc])
	}
	if code := p.get(t, "unlisted.test"); code != http.StatusForbidden {
		t.Errorf("unlisted name through the proxy: %d, want 403", code)
	}
	if m, err := p.api.Mode(context.Background()); err != nil || m != policy.Active {
		t.Errorf("mode %s, %v; want active", m, err)
	}
}
