package httpfilter

import (
	"fmt"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// TestHealthcheckLookalikesAreOrdinaryNames: only healthcheck.abox.local is
// answered by the proxy; a name that starts or ends like it is decided by
// the allowlist (refused here) on the plain-HTTP and CONNECT paths.
func TestHealthcheckLookalikesAreOrdinaryNames(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"example.com"}})
	for _, n := range []string{"healthcheck.abox.local.evil.test", "healthcheck.abox.localx", "a.healthcheck.abox.local.evil.test"} {
		for _, raw := range []string{
			fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", n, n),
			fmt.Sprintf("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n", n, n),
		} {
			resp, body := h.rawRequest(t, raw)
			if resp.StatusCode != 403 || resp.Header.Get("X-Abox-Reason") != allowlist.ReasonNotAllowlisted {
				t.Errorf("%q: %d %s %q, want 403 %s", raw, resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body, allowlist.ReasonNotAllowlisted)
			}
		}
	}
}

// TestSpecialUseRefusedInEveryMode: the proxy refuses local and special-use
// names (printer.local, metadata.google.internal, _gateway) in passive mode
// too, before any lookup.
func TestSpecialUseRefusedInEveryMode(t *testing.T) {
	for _, passive := range []bool{false, true} {
		h := newHarness(t, hopts{passive: passive})
		for _, n := range []string{"printer.local", "metadata.google.internal", "_gateway", "localhost", "router.home.arpa"} {
			resp, body := h.rawRequest(t, fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", n, n))
			if resp.StatusCode != 403 || resp.Header.Get("X-Abox-Reason") != allowlist.ReasonSpecialUse {
				t.Errorf("passive=%v %s: %d %s %q, want 403 %s", passive, n, resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body, allowlist.ReasonSpecialUse)
			}
		}
		h.res.mu.Lock()
		if len(h.res.calls) != 0 {
			t.Errorf("passive=%v: special-use names were looked up: %v", passive, h.res.calls)
		}
		h.res.mu.Unlock()
	}
}
