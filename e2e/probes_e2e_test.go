//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/instance"
)

// guestProbes are what a developer using the sandbox runs first, on the
// suite's running guest: the proxy settings reach sudo and services, the
// guest's own resolver (systemd-resolved's stub) answers the healthcheck
// and allowlisted names without IPv6, common clients trust the instance
// CA, DNS queries that dig sends over TCP are answered, and the boot left
// no failed unit. Each was a failure of an in-guest probe battery (except
// where it says control); one ssh round trip each.
func (s *suite) guestProbes(t *testing.T, st instance.State) {
	gw := st.Gateway.String()
	proxy := fmt.Sprintf("http://%s:%d", gw, st.ProxyPort)
	// not, when set, must not be in the output (an IPv6 address).
	for _, p := range []struct{ name, cmd, want, not string }{
		// sudo resets the environment: without the sudoers drop-in this
		// goes direct and times out.
		{"sudo keeps the proxy settings", "sudo curl -sS -m 20 https://allowed.test/sudo", "GET /sudo host=allowed.test", ""},
		// systemd's manager reads neither /etc/environment nor profile.d.
		{"services get the proxy settings", "sudo systemd-run --quiet --wait --pipe --collect curl -sS -m 20 https://allowed.test/service", "GET /service host=allowed.test", ""},
		// resolved sends .local names to mDNS unless the link routes them.
		{"the stub resolver answers the healthcheck name", "getent hosts healthcheck.abox.local", "127.0.0.1", ""},
		{"the stub resolver answers an allowlisted name, IPv4 only", "getent ahosts allowed.test", originIP, ":"},
		// dig sends ANY over TCP.
		{"dig ANY (over TCP) is answered", "dig +tries=1 +time=5 @" + gw + " ANY allowed.test | grep -o 'status: [A-Z]*'", "status: NOERROR", ""},
		// Controls: clients with trust stores of their own.
		{"Python requests trusts the instance CA", `python3 -c "import requests; print(requests.get('https://allowed.test/requests', timeout=20).text)"`, "GET /requests", ""},
		{"apt trusts the instance CA through its proxy setting", "sudo /usr/lib/apt/apt-helper download-file https://allowed.test/apt /tmp/abox-apt >/dev/null && cat /tmp/abox-apt", "GET /apt", ""},
		{"openssl s_client verifies the interception certificate", "printf 'GET /openssl HTTP/1.1\\r\\nHost: allowed.test\\r\\nConnection: close\\r\\n\\r\\n' | timeout 20 openssl s_client -quiet -verify_return_error -proxy " + gw + ":" + fmt.Sprint(st.ProxyPort) + " -connect allowed.test:443 -servername allowed.test 2>&1", "GET /openssl", ""},
		{"fronting through the proxy is refused", "curl -sS -m 20 -o /dev/null -w '%{http_code}' -x " + proxy + " -H 'Host: blocked.test' https://allowed.test/", "421", ""},
		{"no failed unit", "systemctl --failed --no-legend --plain | awk '{print $1}' | tr '\\n' ' '; echo end", "end", ""},
	} {
		t.Run(p.name, func(t *testing.T) {
			out, err := s.guest(st.Name, p.cmd)
			if err != nil || !strings.Contains(out, p.want) || (p.not != "" && strings.Contains(out, p.not)) || (p.want == "end" && strings.TrimSpace(out) != "end") {
				t.Errorf("%s: %v\n%s\nwant %q", p.cmd, err, out, p.want)
			}
		})
	}
}
