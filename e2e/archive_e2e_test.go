//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// exportImport exports the workflow's instance (stopped), imports it as
// wf2 and boots it: a file written before the export is there, the
// settings came along, the network is its own, and the filters still
// block. wf is left stopped (the next subtest starts it with up); wf2 is
// removed, so at most one guest runs at a time.
func (w *wf) exportImport(t *testing.T) {
	w.guest(t, "echo carried-by-the-archive > ~/marker && sync")
	w.must(t, "stop", "wf")
	archive := filepath.Join(t.TempDir(), "wf.abox")
	t0 := time.Now()
	out := w.must(t, "export", "wf", "-o", archive)
	fi, err := os.Stat(archive)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("archive: %v %v\n%s", fi, err, out)
	}
	t.Logf("FIGURE export (flatten + gzip) of a Debian 12 instance: %s, archive %.0f MiB", time.Since(t0).Round(time.Second), float64(fi.Size())/(1<<20))
	archiveHoldsNoValue(t, archive, w.secret)

	// The lab's instance widens the sandbox (allowlist, resolver, CA):
	// without --trust the import lists that and makes nothing.
	if out, err := w.abox("import", archive, "--name", "wf2"); err == nil || !strings.Contains(out, "--trust") || !strings.Contains(out, "dns.upstreams") {
		t.Fatalf("untrusted import: %v\n%s", err, out)
	}
	if _, err := os.Stat(paths.Layout{Root: w.lab.Home}.InstanceDir("wf2")); err == nil {
		t.Fatal("the refused import left an instance directory")
	}
	t0 = time.Now()
	w.must(t, "import", archive, "--name", "wf2", "--trust")
	t.Logf("FIGURE import: %s", time.Since(t0).Round(time.Second))
	l := paths.Layout{Root: w.lab.Home}
	src, err := instance.Load(l, "wf")
	if err != nil {
		t.Fatal(err)
	}
	got, err := instance.Load(l, "wf2")
	if err != nil {
		t.Fatal(err)
	}
	if got.Subnet == src.Subnet || got.MAC == src.MAC || got.Bridge == src.Bridge || got.UUID == src.UUID {
		t.Errorf("wf2 shares network identity with wf: %+v / %+v", got, src)
	}
	if got.NoMITM != src.NoMITM || got.User != src.User || strings.Join(got.Upstreams, ",") != strings.Join(src.Upstreams, ",") || got.Monitor != src.Monitor {
		t.Errorf("settings changed: %+v / %+v", got, src)
	}

	t0 = time.Now()
	w.must(t, "start", "wf2", "--timeout", "12m")
	t.Logf("FIGURE first boot of the imported instance to ssh-ready: %s", time.Since(t0).Round(time.Second))
	guest := func(cmd string) string { return strings.TrimSpace(w.must(t, "ssh", "wf2", "--", cmd)) }
	if m := guest("cat ~/marker"); m != "carried-by-the-archive" {
		t.Errorf("the file written before export reads %q", m)
	}
	gw := got.Gateway.String()
	if addr := guest("ip -4 -o addr show scope global | awk '{print $4}'"); addr != got.GuestIP.String()+"/24" {
		t.Errorf("the guest's address is %q, want its new %s/24", addr, got.GuestIP)
	}
	// cloud-init took the new seed: the guest's proxy is the new gateway.
	proxy := fmt.Sprintf("http://%s:%d", gw, instance.DefaultProxyPort)
	if env := guest("echo $https_proxy"); env != proxy {
		t.Errorf("https_proxy in wf2 = %q, want %s", env, proxy)
	}
	// The carried CA: the proxy intercepts with it and the guest trusts it.
	if out := guest("curl -sS -m 20 --noproxy '' -x " + proxy + " https://allowed.test/after-import"); !strings.Contains(out, "GET /after-import") {
		t.Errorf("allowlisted HTTPS from wf2: %q", out)
	}
	if code := guest("curl -sS -m 20 --noproxy '' -x " + proxy + " -o /dev/null -w '%{http_code}' http://blocked.test/ || true"); code != "403" {
		t.Errorf("blocked HTTP from wf2 = %q, want 403", code)
	}
	if got := guest("dig +short +tries=1 +time=5 @" + gw + " blocked.test"); got != "" {
		t.Errorf("blocked.test resolves from wf2: %q", got)
	}
	if out, err := w.abox("ssh", "wf2", "--", "curl -sS -m 8 --noproxy '*' http://"+lab.OriginIP+"/"); err == nil {
		t.Errorf("direct egress from wf2 succeeded: %s", out)
	}
	w.must(t, "remove", "--force", "wf2")
}
