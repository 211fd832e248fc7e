//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
)

// filtersAlone takes every packet layer away from a running guest (the
// nwfilter opened to accept-all, abox's host chains and libvirt's own
// chains removed, the guard paused so it cannot put them back) and checks
// that the DNS filter and the proxy on their own still refuse what they
// must: names off the allowlist, URLs off it, and private or host
// addresses through the proxy. The control shows the packet layers really
// were gone (direct egress works meanwhile). Everything is put back.
func (s *suite) filtersAlone(t *testing.T, st instance.State, fw *hostfw.Firewall) {
	b := instance.FirewallBridge(st)
	sup := s.daemonPID(t, st.Name)
	syscall.Kill(sup, syscall.SIGSTOP)
	defer syscall.Kill(sup, syscall.SIGCONT)
	s.openNWFilter(t, st.Name)
	defer s.restoreNWFilter(t, st.Name)
	if err := fw.Remove(s.ctx, st.Bridge); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fw.Ensure(s.ctx, b); err != nil {
			t.Errorf("restoring the chains: %v", err)
		}
	}()
	for _, c := range []string{"LIBVIRT_FWI", "LIBVIRT_FWO", "LIBVIRT_FWX", "LIBVIRT_INP", "LIBVIRT_OUT"} {
		s.inNS(10*time.Second, "iptables", "-w", "10", "-F", c)
	}
	gw := st.Gateway.String()
	proxy := fmt.Sprintf("http://%s:%d", gw, st.ProxyPort)

	// Control: no packet layer is left, so a direct connection leaves.
	if out, err := s.guest(st.Name, "curl -sS -m 8 --noproxy '*' http://"+originIP+"/direct"); err != nil || !strings.Contains(out, "GET /direct") {
		t.Fatalf("control: with every packet layer removed direct egress still failed (%v: %q); the test proves nothing", err, out)
	}
	if out := s.mustGuest(t, st.Name, "dig +tries=2 +time=4 @"+gw+" blocked.test"); !strings.Contains(out, "status: NXDOMAIN") {
		t.Errorf("a name off the allowlist with only the filters: %s", out)
	}
	if out := s.mustGuest(t, st.Name, "dig +short +tries=2 +time=4 @"+gw+" allowed.test"); !hasLine(out, originIP) {
		t.Errorf("control: allowed.test with only the filters = %q, want %s", out, originIP)
	}
	out, _ := s.guest(st.Name, "curl -sS -m 15 -i -x "+proxy+" http://blocked.test/ || true")
	if !strings.Contains(out, " 403 ") || !strings.Contains(out, "not_allowlisted") {
		t.Errorf("a URL off the allowlist through the proxy with only the filters:\n%s", out)
	}
	code := "curl -sS -m 15 --noproxy '' -o /dev/null -w '%{http_code}' -x " + proxy + " "
	for _, u := range []string{"http://" + lab.HostSide + ":8081/", "http://" + gw + ":8081/", "http://127.0.0.1:8081/", "http://10.0.0.5/"} {
		if out, _ := s.guest(st.Name, code+"'"+u+"'"); out != "403" {
			t.Errorf("%s through the proxy with only the filters = %q, want 403", u, out)
		}
	}
	if out := s.mustGuest(t, st.Name, "curl -sS -m 15 -x "+proxy+" http://allowed.test/filters-alone"); !strings.Contains(out, "GET /filters-alone") {
		t.Errorf("control: an allowlisted URL through the proxy with only the filters = %q", out)
	}
}
