package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/policy"
)

type fakeHV struct {
	state    libvirt.DomainState
	live     []libvirt.NIC
	persist  []libvirt.NIC
	bindings map[string]string
	filter   *libvirtxml.NWFilter
}

func (f *fakeHV) State(context.Context, string) (libvirt.DomainState, error) { return f.state, nil }
func (f *fakeHV) DomainNICs(_ context.Context, _ string, live bool) ([]libvirt.NIC, error) {
	if live {
		return f.live, nil
	}
	return f.persist, nil
}
func (f *fakeHV) NWFilterBindings(context.Context) (map[string]string, error) { return f.bindings, nil }
func (f *fakeHV) NWFilter(context.Context, string) (*libvirtxml.NWFilter, error) {
	if f.filter == nil {
		return nil, fmt.Errorf("reading nwfilter: %w", libvirt.ErrNotFound)
	}
	return f.filter, nil
}

type fakeFW struct{ problems, portProblems, nwProblems []string }

func (f *fakeFW) Check(_ context.Context, b hostfw.Bridge) (hostfw.Status, error) {
	return hostfw.Status{Bridge: b.Name, Problems: f.problems}, nil
}

func (f *fakeFW) CheckPort(_ context.Context, p hostfw.Port) (hostfw.Status, error) {
	return hostfw.Status{Bridge: p.Bridge, Problems: f.portProblems}, nil
}

func (f *fakeFW) CheckNWFilter(_ context.Context, tap string) (hostfw.Status, error) {
	return hostfw.Status{Problems: f.nwProblems}, nil
}

type fakeFilters struct {
	mode    policy.Mode
	err     error
	unsaved string         // an allowlist change in force but not on disk
	comps   map[string]any // the filters' counters
}

func (f *fakeFilters) Status(context.Context) (api.Status, error) {
	return api.Status{Mode: f.mode, Allowlist: policy.ReloadStatus{Unsaved: f.unsaved}, Components: f.comps}, f.err
}

// servers runs a DNS server answering the healthcheck and an HTTP server
// answering as the proxy does, on loopback.
func servers(t *testing.T) (dnsAddr, proxyAddr string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if r.Question[0].Name == policy.HealthcheckName+"." {
			rr, _ := dns.NewRR(policy.HealthcheckName + ". 0 IN A 127.0.0.1")
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})}
	go ds.ActivateAndServe()
	t.Cleanup(func() { ds.Shutdown() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Host != policy.HealthcheckName {
			http.Error(w, "no", http.StatusForbidden)
			return
		}
		w.Header().Set("X-Abox-Reason", policy.ReasonHealthcheck)
	})}
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return pc.LocalAddr().String(), ln.Addr().String()
}

const bridge = "abx0123"

func healthyInstance(t *testing.T) (Instance, *fakeHV, *fakeFW, *fakeFilters) {
	st := instance.State{Name: "dev", Bridge: bridge, Gateway: netip.MustParseAddr("10.10.3.1"), GuestIP: netip.MustParseAddr("10.10.3.10"), ProxyPort: 3128}
	filter := &libvirtxml.NWFilter{Name: "abox-dev", Entries: []libvirtxml.NWFilterEntry{{Rule: &libvirtxml.NWFilterRule{Action: "drop", Direction: "inout", Priority: 999}}}}
	same := *filter
	hv := &fakeHV{
		state:    libvirt.StateRunning,
		live:     []libvirt.NIC{{Target: "vnet0", MAC: "52:54:00:00:00:01", FilterRef: "abox-dev"}},
		persist:  []libvirt.NIC{{MAC: "52:54:00:00:00:01", FilterRef: "abox-dev"}},
		bindings: map[string]string{"vnet0": "abox-dev"},
		filter:   &same,
	}
	fw := &fakeFW{}
	fl := &fakeFilters{mode: policy.Active}
	d, p := servers(t)
	in := Instance{
		State: st, Files: paths.Instance{LogsDir: t.TempDir(), APISocket: "/x/api.sock", DaemonLog: "/x/daemon.log"},
		Filter: filter, Hypervisor: hv, Firewall: fw, Filters: fl, DNSAddr: d, ProxyAddr: p,
	}
	return in, hv, fw, fl
}

func failures(r Report) []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status == Fail {
			out = append(out, c.Layer+"/"+c.Name)
		}
	}
	return out
}

// TestDoctorNamesEachBrokenLayer breaks one layer at a time and checks that
// exactly that layer's check fails, with a fix.
func TestDoctorNamesEachBrokenLayer(t *testing.T) {
	tests := []struct {
		name  string
		brk   func(hv *fakeHV, fw *fakeFW, fl *fakeFilters)
		fails []string
	}{
		{"healthy", func(*fakeHV, *fakeFW, *fakeFilters) {}, nil},
		{"binding deleted", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) { delete(hv.bindings, "vnet0") },
			[]string{"nwfilter/bound on the live interface"}},
		{"bound to another filter", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) { hv.bindings["vnet0"] = "allow-all" },
			[]string{"nwfilter/bound on the live interface"}},
		{"nwfilter's kernel rules flushed", func(_ *fakeHV, fw *fakeFW, _ *fakeFilters) {
			fw.nwProblems = []string{"ebtables: nat PREROUTING jump to libvirt-I-vnet0 missing"}
		}, []string{"nwfilter/kernel rules in place"}},
		{"persistent definition without filterref", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) {
			hv.persist = []libvirt.NIC{{MAC: "52:54:00:00:00:01"}}
		}, []string{"nwfilter/persistent definition references it"}},
		{"filter edited", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) {
			hv.filter = &libvirtxml.NWFilter{Name: "abox-dev", Entries: []libvirtxml.NWFilterEntry{{Rule: &libvirtxml.NWFilterRule{Action: "accept", Direction: "inout", Priority: 999}}}}
		}, []string{"nwfilter/filter defined"}},
		{"filter missing", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) { hv.filter = nil }, []string{"nwfilter/filter defined"}},
		{"chain missing", func(_ *fakeHV, fw *fakeFW, _ *fakeFilters) {
			fw.problems = []string{"iptables: chain ABOXI-" + bridge + " missing"}
		}, []string{"hostfw/host chains present and first"}},
		{"foreign rule first", func(_ *fakeHV, fw *fakeFW, _ *fakeFilters) {
			fw.problems = []string{"iptables: INPUT jump for traffic from " + bridge + " to the host is not first in INPUT (another rule comes before it)"}
		}, []string{"hostfw/host chains present and first"}},
		{"tap out of its bridge", func(_ *fakeHV, fw *fakeFW, _ *fakeFilters) {
			fw.portProblems = []string{"tap vnet0 is not a port of " + bridge}
		}, []string{"hostfw/guest's tap on its bridge"}},
		{"daemon down", func(_ *fakeHV, _ *fakeFW, fl *fakeFilters) { fl.err = api.ErrNotRunning },
			[]string{"daemon/api answering"}},
		{"domain off", func(hv *fakeHV, _ *fakeFW, _ *fakeFilters) { hv.state = libvirt.StateShutoff },
			[]string{"vm/domain running"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in, hv, fw, fl := healthyInstance(t)
			tc.brk(hv, fw, fl)
			r := Doctor(context.Background(), in)
			got := failures(r)
			if strings.Join(got, ",") != strings.Join(tc.fails, ",") {
				t.Fatalf("failures = %q, want %q\n%+v", got, tc.fails, r.Checks)
			}
			for _, c := range r.Checks {
				if c.Status == Fail && c.Fix == "" {
					t.Errorf("%s/%s fails without a fix", c.Layer, c.Name)
				}
			}
		})
	}
}

// TestDoctorWarnsOfLogTrouble: a decision log that cannot be written and
// an allowlist change that could not be saved are each a warning with a
// fix, the other checks unaffected.
func TestDoctorWarnsOfLogTrouble(t *testing.T) {
	for name, brk := range map[string]func(*fakeFilters){
		"dns log": func(f *fakeFilters) {
			f.comps = map[string]any{"dns": map[string]any{"log_error": "write dns.log: no space left on device"}}
		},
		"http log": func(f *fakeFilters) {
			f.comps = map[string]any{"http": map[string]any{"log": map[string]any{"last_error": "write http.log: no space left on device"}}}
		},
		"unsaved": func(f *fakeFilters) { f.unsaved = "write allowlist.txt: no space left on device" },
	} {
		t.Run(name, func(t *testing.T) {
			in, _, _, fl := healthyInstance(t)
			brk(fl)
			r := Doctor(context.Background(), in)
			if got := failures(r); len(got) != 0 {
				t.Errorf("failures = %q, want none", got)
			}
			var found bool
			for _, c := range r.Checks {
				if c.Layer == "daemon" && c.Name == "logs and saved policy" {
					found = true
					if c.Status != Warn || !strings.Contains(c.Detail, "no space left on device") || c.Fix == "" {
						t.Errorf("check = %+v, want a warning naming the error, with a fix", c)
					}
				}
			}
			if !found {
				t.Errorf("no logs check in %+v", r.Checks)
			}
		})
	}
}

func TestDoctorDNSAndProxyDown(t *testing.T) {
	in, _, _, _ := healthyInstance(t)
	in.DNSAddr, in.ProxyAddr = "127.0.0.1:1", "127.0.0.1:1"
	got := failures(Doctor(context.Background(), in))
	if strings.Join(got, ",") != "dns/filter answering,proxy/filter answering" {
		t.Errorf("failures = %q", got)
	}
}

// TestGuestProbes feeds the probe parser what a guest prints, including a
// hostile guest's forged and garbled lines.
func TestGuestProbes(t *testing.T) {
	in, _, _, _ := healthyInstance(t)
	ps := probes(in, false)
	if out, err := exec.Command("sh", "-n", "-c", script(ps)).CombinedOutput(); err != nil {
		t.Fatalf("the probe script is not valid sh: %v\n%s", err, out)
	}
	// What each probe prints on a sandbox that holds.
	good := func(p probe) (int, string) {
		switch {
		case strings.HasPrefix(p.name, "dns works"):
			return 0, "127.0.0.1"
		case strings.HasPrefix(p.name, "CA installed"):
			return 0, "200"
		case strings.Contains(p.name, "NXDOMAIN"):
			return 0, "status: NXDOMAIN EDE: 15 (Blocked): (not_allowlisted)"
		case strings.Contains(p.name, "URL gets 403"):
			return 0, "HTTP/1.1 403 Forbidden X-Abox-Reason: not_allowlisted"
		case strings.HasPrefix(p.name, "private"):
			return 0, "HTTP/1.1 403 Forbidden X-Abox-Reason: private"
		case strings.HasPrefix(p.name, "metadata"):
			return 0, "HTTP/1.1 403 Forbidden x-abox-reason: metadata"
		case strings.HasPrefix(p.name, "third-party"):
			return 9, ";; communications error to 1.1.1.1#53: host unreachable"
		case strings.HasPrefix(p.name, "ping"):
			return 1, "1 packets transmitted, 0 received"
		case strings.HasPrefix(p.name, "guest tools"):
			return 0, "missing:"
		}
		return 7, "curl: (7) Failed to connect to 1.1.1.1 port 80 after 0 ms: Couldn't connect to server"
	}
	run := func(mod func(i int, p probe) string) Report {
		in.Guest = func(ctx context.Context, _ string) ([]byte, error) {
			var b strings.Builder
			b.WriteString("99\t0\tforged line for a probe that does not exist\n\x1b[2Jgarbage\n")
			for i, p := range ps {
				if l := mod(i, p); l != "" {
					b.WriteString(l + "\n")
				}
			}
			return []byte(b.String()), nil
		}
		var r Report
		guestProbes(context.Background(), in, true, &r)
		return r
	}
	r := run(func(i int, p probe) string { rc, o := good(p); return fmt.Sprintf("%d\t%d\t%s", i, rc, o) })
	if f := failures(r); len(f) != 0 || len(r.Checks) != len(ps) {
		t.Fatalf("healthy probes: failures %q, %d checks for %d probes", f, len(r.Checks), len(ps))
	}
	// Each probe, when the sandbox leaks, fails on its own.
	for i, p := range ps {
		r := run(func(j int, q probe) string {
			rc, o := good(q)
			if j == i {
				rc, o = 0, "connected; HTTP/1.1 200 OK; 11.22.33.44"
				if strings.HasPrefix(q.name, "dns works") || strings.HasPrefix(q.name, "CA installed") {
					rc, o = 60, "curl: (60) SSL certificate problem"
				}
			}
			return fmt.Sprintf("%d\t%d\t%s", j, rc, o)
		})
		if strings.HasPrefix(p.name, "guest tools") {
			// Not an isolation failure: a warning naming the tool.
			if f := failures(r); len(f) != 0 || r.Checks[i].Status != Warn {
				t.Errorf("tools not set: failures %q, status %s", f, r.Checks[i].Status)
			}
			continue
		}
		if f := failures(r); len(f) != 1 || f[0] != "guest/"+p.name {
			t.Errorf("leaking %q: failures %q", p.name, f)
		}
	}
	// A refused flow that hangs instead of being answered (the answer
	// table gone) is a warning, not an isolation failure.
	r = run(func(j int, q probe) string {
		rc, o := good(q)
		if rc == 7 {
			rc, o = 28, "curl: (28) Connection timed out"
		}
		return fmt.Sprintf("%d\t%d\t%s", j, rc, o)
	})
	warned := 0
	for _, c := range r.Checks {
		if c.Status == Warn {
			warned++
		}
	}
	if f := failures(r); len(f) != 0 || warned == 0 {
		t.Errorf("dropped without an answer: failures %q, %d warnings; want warnings only", f, warned)
	}
	// A probe that never reports fails; no output at all is an ssh failure.
	r = run(func(j int, q probe) string {
		if j == 0 {
			return ""
		}
		rc, o := good(q)
		return fmt.Sprintf("%d\t%d\t%s", j, rc, o)
	})
	if f := failures(r); len(f) != 1 {
		t.Errorf("missing report: failures %q", f)
	}
	in.Guest = func(context.Context, string) ([]byte, error) { return nil, errors.New("ssh: connect refused") }
	var rr Report
	guestProbes(context.Background(), in, true, &rr)
	if f := failures(rr); len(f) != 1 || f[0] != "guest/ssh" {
		t.Errorf("ssh down: failures %q", f)
	}
}

// TestToolsProbeInARealShell runs the guest-tools probe in sh against files
// that do and do not mention the proxy, with one variable unset.
func TestToolsProbeInARealShell(t *testing.T) {
	dir := t.TempDir()
	px := "http://10.10.0.1:28128"
	good := filepath.Join(dir, "npmrc")
	bad := filepath.Join(dir, "pip.conf")
	os.WriteFile(good, []byte("proxy="+px+"\n"), 0o600)
	os.WriteFile(bad, []byte("[global]\nproxy = http://elsewhere:3128\n"), 0o600)
	cmd := exec.Command("sh", "-c", toolsProbe(px, []string{good, bad, filepath.Join(dir, "gone")}, []string{"ABOX_T_SET", "ABOX_T_UNSET"}))
	cmd.Env = append(os.Environ(), "ABOX_T_SET=x")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := strings.Fields(strings.TrimPrefix(strings.TrimSpace(string(out)), "missing:"))
	want := []string{bad, filepath.Join(dir, "gone"), "$ABOX_T_UNSET"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("probe reports %q, want %q", got, want)
	}
}

// TestDoctorNWFilterKernelRules: rules libvirt no longer has in the kernel
// (a flush) fail with libvirt's own repair for that tap; without a binding
// there is nothing to look at, so the check is skipped, not failed twice.
func TestDoctorNWFilterKernelRules(t *testing.T) {
	find := func(r Report) Check {
		t.Helper()
		for _, c := range r.Checks {
			if c.Layer == "nwfilter" && c.Name == nwfilterRulesCheck {
				return c
			}
		}
		t.Fatalf("no %s check in %+v", nwfilterRulesCheck, r.Checks)
		return Check{}
	}
	in, hv, fw, _ := healthyInstance(t)
	if c := find(Doctor(context.Background(), in)); c.Status != Pass || !strings.Contains(c.Detail, "vnet0") {
		t.Errorf("healthy: %+v", c)
	}
	fw.nwProblems = []string{"iptables: filter chain FI-vnet0 is empty"}
	c := find(Doctor(context.Background(), in))
	if c.Status != Fail || !strings.Contains(c.Detail, "FI-vnet0 is empty") || !strings.Contains(c.Fix, "virsh nwfilter-binding-create") ||
		!strings.Contains(c.Fix, "nwfilter-binding-delete vnet0") || !strings.Contains(c.Fix, "abox restart dev") {
		t.Errorf("flushed: %+v", c)
	}
	delete(hv.bindings, "vnet0")
	if c := find(Doctor(context.Background(), in)); c.Status != Skip {
		t.Errorf("no binding: %+v, want skipped", c)
	}
}
