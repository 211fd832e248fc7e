//go:build e2e

package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// noProxy runs curl as a client that ignores the proxy settings does:
// no proxy variables, no proxy at all.
const noProxy = "env -u https_proxy -u HTTPS_PROXY -u http_proxy -u HTTP_PROXY -u all_proxy -u ALL_PROXY curl --noproxy '*' -sS -m 20 "

// proxyUnawareCaptured: a client that ignores the proxy reaches an
// allowlisted name over HTTPS (intercepted: the instance CA signs what it
// sees) and plain HTTP through the host's capture of ports 443 and 80;
// the destination it picks is not trusted (a connection for allowed.test
// aimed at 1.1.1.1 reaches allowed.test's checked address); a name not
// allowed, an address without a name and a ClientHello without SNI are
// refused at once; and each shows in the proxy's log with its reason.
func (s *suite) proxyUnawareCaptured(t *testing.T, st instance.State) {
	for _, p := range []struct{ what, cmd, want string }{
		{"HTTPS to an allowlisted name", noProxy + "https://www.allowed.test/captured-tls", "GET /captured-tls host=www.allowed.test"},
		{"plain HTTP to an allowlisted name", noProxy + "http://allowed.test/captured-plain", "GET /captured-plain host=allowed.test"},
		{"HTTPS aimed at another address goes to the name's", noProxy + "--resolve www.allowed.test:443:1.1.1.1 https://www.allowed.test/captured-elsewhere", "GET /captured-elsewhere host=www.allowed.test"},
		{"plain HTTP aimed at another address goes to the name's", noProxy + "--resolve allowed.test:80:1.1.1.1 http://allowed.test/captured-elsewhere", "GET /captured-elsewhere host=allowed.test"},
		{"the interception CA signed it", noProxy + "-v -o /dev/null https://www.allowed.test/issuer 2>&1 | grep -i 'issuer:'", "abox interception CA"},
	} {
		if out, err := s.guest(st.Name, p.cmd); err != nil || !strings.Contains(out, p.want) {
			t.Errorf("%s: %v\n%s\nwant %q", p.what, err, out, p.want)
		}
	}
	refusals := []struct{ what, cmd, want, reason string }{
		{"HTTPS to a name not allowed", noProxy + "--resolve blocked.test:443:" + originIP + " https://blocked.test/", "access denied", "not_allowlisted"},
		{"plain HTTP to a name not allowed", noProxy + "--resolve blocked.test:80:" + originIP + " http://blocked.test/", "reset", "not_allowlisted"},
		{"HTTPS to an address (no SNI)", noProxy + "-k https://" + originIP + "/", "access denied", "capture_no_sni"},
		{"plain HTTP to an address", noProxy + "http://" + originIP + "/", "reset", "capture_address_name"},
	}
	for _, p := range refusals {
		out, err := s.guest(st.Name, timed(p.cmd))
		m := timedRE.FindStringSubmatch(out)
		if m != nil {
			t.Logf("FIGURE captured-refusal %s: exit %s after %s ms by the guest's clock", p.what, m[1], m[2])
		}
		if strings.Contains(out, "GET /") || strings.Contains(out, "ABOX-TIMED rc=0 ") || !strings.Contains(strings.ToLower(out), p.want) {
			t.Errorf("%s: %v\n%s\nwant a failure saying %q", p.what, err, out, p.want)
		}
	}
	// The decision lines are written behind the answers: wait for the
	// last refusal's.
	var logs string
	poll(s.ctx, 15*time.Second, func() bool {
		b, _ := os.ReadFile(paths.Layout{Root: s.home}.Instance(st.Name).HTTPLog)
		logs = string(b)
		return strings.Contains(logs, `"reason":"`+refusals[len(refusals)-1].reason+`"`)
	})
	for _, p := range refusals {
		if !strings.Contains(logs, `"reason":"`+p.reason+`"`) {
			t.Errorf("%s: no %s line in the proxy's log:\n%s", p.what, p.reason, tail(logs, 20))
		}
	}
	if !strings.Contains(logs, `"orig_dst":"1.1.1.1:443"`) || !strings.Contains(logs, `"orig_dst":"1.1.1.1:80"`) {
		t.Errorf("the capture lines lack the guest's chosen destinations (orig_dst 1.1.1.1):\n%s", tail(logs, 20))
	}
}
