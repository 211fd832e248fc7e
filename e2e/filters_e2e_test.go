//go:build e2e

package e2e

import (
	"strings"
	"testing"
)

// filterPolicyChecks are the VM suite's checks of the filter properties of
// issue 11 as a guest's own tools see them, on the suite's running guest:
// special-use names never answered by the upstream, every cloud's metadata
// endpoints refused as metadata in IPv4 and mapped form, TRACE never
// forwarded. (Each is proven in depth by the unit tests named in
// docs/dns.md and docs/http.md; this is the end-to-end path.)
func (s *suite) filterPolicyChecks(t *testing.T, gw, proxy string) {
	t.Run("special-use names are refused in the guest's resolver path", func(t *testing.T) {
		for _, n := range []string{"printer.local", "metadata.google.internal", "localhost", "_gateway"} {
			out := s.mustGuest(t, "dev", "dig +tries=1 +time=5 @"+gw+" "+n)
			if !strings.Contains(out, "status: NXDOMAIN") || !strings.Contains(out, "special_use_name") {
				t.Errorf("dig %s:\n%s", n, out)
			}
		}
	})
	t.Run("cloud metadata endpoints are refused as metadata", func(t *testing.T) {
		for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://168.63.129.16/machine?comp=goalstate", "http://[::ffff:168.63.129.16]/", "http://100.100.100.200/latest/meta-data/"} {
			out, _ := s.guest("dev", "curl -sS -m 15 --noproxy '' -i -x "+proxy+" '"+u+"' || true")
			if !strings.Contains(out, " 403 ") || !strings.Contains(strings.ToLower(out), "x-abox-reason: metadata") {
				t.Errorf("%s through the proxy:\n%s", u, out)
			}
		}
	})
	t.Run("TRACE is answered by the proxy, never forwarded", func(t *testing.T) {
		out, _ := s.guest("dev", "curl -sS -m 15 --noproxy '' -i -X TRACE -x "+proxy+" http://allowed.test/trace || true")
		if !strings.Contains(out, " 405 ") || strings.Contains(out, "hello from testorigin") {
			t.Errorf("TRACE through the proxy:\n%s", out)
		}
	})
}
