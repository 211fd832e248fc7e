package instance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/libvirt"
)

func (f *fakeFW) Check(ctx context.Context, b hostfw.Bridge) (hostfw.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := hostfw.Status{Bridge: b.Name}
	if !f.chains[b.Name] {
		st.Problems = append(st.Problems, "iptables: chain ABOX-"+b.Name+" missing")
	}
	return st, nil
}

// runningRig is a created instance whose guest the fake libvirt says runs.
func runningRig(t *testing.T) (*rig, State) {
	t.Helper()
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	return r, st
}

func (r *rig) guard(log io.Writer) Guard {
	return Guard{Layout: r.m.Layout, Name: "dev", Firewall: r.fw, Hypervisor: r.hv, Log: slog.New(slog.NewTextHandler(log, nil)), NWFilterSettle: 4 * time.Millisecond}
}

// TestGuardRepairsChains: chains removed under a running guest are put
// back by the next round.
func TestGuardRepairsChains(t *testing.T) {
	r, st := runningRig(t)
	var log bytes.Buffer
	g := r.guard(&log)
	if err := g.Once(context.Background()); err != nil {
		t.Fatalf("intact round: %v", err)
	}
	r.fw.Remove(context.Background(), st.Bridge)
	if err := g.Once(context.Background()); err != nil {
		t.Fatalf("repair round: %v", err)
	}
	if !r.fw.chains[st.Bridge] || !strings.Contains(log.String(), "repaired") {
		t.Errorf("chains %v after a round, log %q; want them repaired", r.fw.chains[st.Bridge], log.String())
	}
	if n := strings.Count(strings.Join(r.hv.callList(), " "), "SetLinkDown"); n != 0 {
		t.Errorf("link taken down %d times although the repair worked", n)
	}
}

// TestGuardTakesTheLinkDown: when the chains cannot be restored the
// guest's link goes down.
func TestGuardTakesTheLinkDown(t *testing.T) {
	r, st := runningRig(t)
	r.fw.Remove(context.Background(), st.Bridge)
	r.fw.fail = true
	r.hv.calls = nil
	err := r.guard(io.Discard).Once(context.Background())
	if !errors.Is(err, ErrLinkDown) {
		t.Fatalf("Once = %v, want ErrLinkDown", err)
	}
	if got := r.hv.callList(); !strings.Contains(strings.Join(got, " "), "SetLinkDown") {
		t.Errorf("calls = %v, want SetLinkDown", got)
	}
}

// TestGuardRebuildsFlushedNWFilterRules: the kernel rules of the
// nwfilter's binding, flushed under a running guest (libvirt notices
// nothing), are rebuilt by the next round; if they do not come back, the
// guest's link goes down.
func TestGuardRebuildsFlushedNWFilterRules(t *testing.T) {
	r, _ := runningRig(t)
	dom := libvirt.DomainName("dev")
	r.hv.taps = map[string][]string{dom: {"vnet7"}}
	r.fw.flushed = map[string]bool{"vnet7": true}
	r.hv.rebind = func(tap string) error {
		r.fw.mu.Lock()
		defer r.fw.mu.Unlock()
		delete(r.fw.flushed, tap)
		return nil
	}
	var log bytes.Buffer
	if err := r.guard(&log).Once(context.Background()); err != nil {
		t.Fatalf("repair round: %v", err)
	}
	calls := strings.Join(r.hv.callList(), " ")
	if r.fw.flushed["vnet7"] || !strings.Contains(calls, "RebindNWFilter") || !strings.Contains(log.String(), "nwfilter rules rebuilt") {
		t.Errorf("after a round: flushed %v, calls %v, log %q; want the binding rebuilt", r.fw.flushed, calls, log.String())
	}
	if strings.Contains(calls, "SetLinkDown") {
		t.Errorf("link taken down although the rebuild worked")
	}

	t.Run("rules that do not come back", func(t *testing.T) {
		r.fw.flushed = map[string]bool{"vnet7": true}
		r.hv.rebind = func(string) error { return nil } // libvirt rebuilt nothing
		r.hv.calls = nil
		err := r.guard(io.Discard).Once(context.Background())
		if !errors.Is(err, ErrLinkDown) || !strings.Contains(err.Error(), "still missing") {
			t.Fatalf("Once = %v, want ErrLinkDown naming the missing rules", err)
		}
		if !strings.Contains(strings.Join(r.hv.callList(), " "), "SetLinkDown") {
			t.Errorf("calls = %v, want SetLinkDown", r.hv.callList())
		}
	})
	t.Run("a listing that fails", func(t *testing.T) {
		// ebtables-nft fails a listing that races libvirt's own edits:
		// that says nothing about the rules, so the link stays up, and
		// one failure alone is tried again within the round.
		r.fw.flushed = nil
		r.fw.checkFails = 2
		r.hv.calls = nil
		if err := r.guard(io.Discard).Once(context.Background()); err != nil {
			t.Fatalf("Once with a listing failing twice = %v, want it tried again", err)
		}
		r.fw.checkFails = 100
		err := r.guard(io.Discard).Once(context.Background())
		if err == nil || errors.Is(err, ErrLinkDown) || strings.Contains(strings.Join(r.hv.callList(), " "), "SetLinkDown") {
			t.Fatalf("Once with every listing failing = %v (calls %v), want an error and the link up", err, r.hv.callList())
		}
		r.fw.checkFails = 0
	})
	t.Run("rules libvirt is rebuilding itself", func(t *testing.T) {
		r.fw.flushed = map[string]bool{"vnet7": true}
		r.fw.onCheck = func() { delete(r.fw.flushed, "vnet7") } // back by the second look
		r.hv.calls = nil
		if err := r.guard(io.Discard).Once(context.Background()); err != nil {
			t.Fatal(err)
		}
		if calls := strings.Join(r.hv.callList(), " "); strings.Contains(calls, "RebindNWFilter") {
			t.Errorf("calls %v: the binding was rebuilt although libvirt was rebuilding it", calls)
		}
		r.fw.onCheck = nil
	})
	t.Run("a filter defined otherwise is not judged", func(t *testing.T) {
		// Defined open through libvirt (doctor reports the definition):
		// the binding's rules follow it, and rebuilding repeats it.
		saved := r.hv.filterXML[libvirt.FilterName("dev")]
		r.hv.filterXML[libvirt.FilterName("dev")] = "<filter name='" + libvirt.FilterName("dev") + "' chain='root'><rule action='accept' direction='inout' priority='-1000'><all/></rule></filter>"
		defer func() { r.hv.filterXML[libvirt.FilterName("dev")] = saved }()
		r.fw.flushed = map[string]bool{"vnet7": true}
		r.hv.calls = nil
		if err := r.guard(io.Discard).Once(context.Background()); err != nil {
			t.Fatalf("Once with the filter defined open = %v", err)
		}
		if calls := strings.Join(r.hv.callList(), " "); strings.Contains(calls, "RebindNWFilter") || strings.Contains(calls, "SetLinkDown") {
			t.Errorf("calls %v: the guard acted on rules an open definition makes", calls)
		}
	})
	t.Run("a rebuild libvirt refuses", func(t *testing.T) {
		r.fw.flushed = map[string]bool{"vnet7": true}
		r.hv.rebind = func(string) error { return errors.New("binding lookup failed") }
		r.hv.calls = nil
		if err := r.guard(io.Discard).Once(context.Background()); !errors.Is(err, ErrLinkDown) {
			t.Fatalf("Once = %v, want ErrLinkDown", err)
		}
	})
}

// TestGuardCapsTheSerialLog: a guest flooding its console cannot fill the
// disk: past the cap the log keeps only its tail.
func TestGuardCapsTheSerialLog(t *testing.T) {
	r, _ := runningRig(t)
	g := r.guard(io.Discard)
	g.SerialLogMax = 64 << 10
	f := r.m.Layout.Instance("dev")
	flood := bytes.Repeat([]byte("A"), 200<<10)
	flood = append(flood, []byte("the last line\n")...)
	if err := os.WriteFile(f.SerialLog, flood, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := g.Once(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(f.SerialLog); err != nil || fi.Size() != 0 {
		t.Errorf("serial log after the cap: %v, %v; want it truncated", fi, err)
	}
	old, err := os.ReadFile(f.SerialLog + ".1")
	if err != nil || int64(len(old)) > g.SerialLogMax || !bytes.HasSuffix(old, []byte("the last line\n")) {
		t.Errorf("serial.log.1 = %d bytes, %v; want the tail, at most %d bytes", len(old), err, g.SerialLogMax)
	}
}

// serveStatus answers the daemon API's status on the instance's socket.
func serveStatus(t *testing.T, sock string, components map[string]any) {
	t.Helper()
	os.MkdirAll(filepath.Dir(sock), 0o700)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"instance": "dev", "mode": "active", "components": components})
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// TestHookRefusesWithoutTheLayers: the libvirt hook allows an abox
// domain's start only with its chains intact and its daemon answering,
// and stamps the start it allowed.
func TestHookRefusesWithoutTheLayers(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	dom, _, err := r.m.domainXML(st)
	if err != nil {
		t.Fatal(err)
	}
	h := HookChecker{Firewall: r.fw, Timeout: 10 * time.Second} // the allowed start must not time out on a loaded machine
	run := func() error { return h.RunHook(ctx, strings.NewReader(dom)) }
	if err := run(); err == nil || !strings.Contains(err.Error(), "chain") || !strings.Contains(err.Error(), "filter daemon") {
		t.Errorf("hook with nothing up = %v, want both the chains and the daemon named", err)
	}
	r.fw.Ensure(ctx, FirewallBridge(st))
	if err := run(); err == nil || !strings.Contains(err.Error(), "filter daemon does not answer") {
		t.Errorf("hook without the daemon = %v, want refused", err)
	}
	serveStatus(t, r.m.Layout.Instance("dev").APISocket, map[string]any{"dns": map[string]any{}, "http": map[string]any{}})
	r.fw.Remove(ctx, st.Bridge)
	if err := run(); err == nil || !strings.Contains(err.Error(), "chain") {
		t.Errorf("hook without the chains = %v, want refused", err)
	}
	r.fw.Ensure(ctx, FirewallBridge(st))
	if err := run(); err != nil {
		t.Fatalf("hook with everything up = %v, want allowed", err)
	}
	if ok, err := hookRanSince(r.m.Layout, "dev", st.CreatedAt); err != nil || !ok {
		t.Errorf("stamp after an allowed start = %v, %v", ok, err)
	}
}

func TestHookFindsTheInstanceSafely(t *testing.T) {
	meta := func(name, dir string) string {
		return `<domain><name>abox-dev</name><metadata><instance xmlns="` + libvirt.MetadataNamespace + `" name="` + name + `" dir="` + dir + `"/></metadata></domain>`
	}
	for _, tt := range []struct{ name, xml, want string }{
		{"good", meta("dev", "/var/lib/abox/instances/dev"), ""},
		{"other instance", meta("prod", "/var/lib/abox/instances/prod"), "names instance"},
		{"dir of another name", meta("dev", "/var/lib/abox/instances/prod"), "want <root>/instances/dev"},
		{"relative dir", meta("dev", "instances/dev"), "want <root>/instances/dev"},
		{"dotted dir", meta("dev", "/tmp/../var/lib/abox/instances/dev"), "want <root>/instances/dev"},
		{"no metadata", `<domain><name>abox-dev</name></domain>`, "no abox metadata"},
		{"foreign domain", `<domain><name>web</name></domain>`, "not abox's"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, name, err := instanceOfDomain([]byte(tt.xml))
			if tt.want == "" {
				if err != nil || name != "dev" || l.Root != "/var/lib/abox" {
					t.Errorf("instanceOfDomain = %+v, %q, %v", l, name, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("instanceOfDomain = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestHookScriptIgnoresOtherDomains: the script itself passes foreign
// domains and other operations without running abox.
func TestHookScriptIgnoresOtherDomains(t *testing.T) {
	dir := t.TempDir()
	if _, err := InstallHook(dir, "/nonexistent/abox"); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, HookFile)
	for _, tt := range []struct {
		args []string
		ok   bool
	}{
		{[]string{"web", "prepare", "begin", "-"}, true},
		{[]string{"abox-dev", "release", "end", "-"}, true},
		{[]string{"abox-dev", "prepare", "begin", "-"}, false}, // abox is gone: fail closed
	} {
		err := execScript(script, tt.args...)
		if (err == nil) != tt.ok {
			t.Errorf("hook %v = %v, want ok=%v", tt.args, err, tt.ok)
		}
	}
	if wrote, err := InstallHook(dir, "/nonexistent/abox"); err != nil || wrote {
		t.Errorf("second InstallHook wrote=%v, %v; want nothing to do", wrote, err)
	}
}

func execScript(path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Stdin = strings.NewReader("<domain/>")
	return cmd.Run()
}

// fakePorts plays the guest's tap: out of its bridge until EnsurePort
// plugs it back (unless fail).
type fakePorts struct {
	out, fail bool
	got       []hostfw.Port
}

func (f *fakePorts) CheckPort(ctx context.Context, p hostfw.Port) (hostfw.Status, error) {
	f.got = append(f.got, p)
	st := hostfw.Status{Bridge: p.Bridge}
	if f.out {
		st.Problems = append(st.Problems, "tap vnet0 is not a port of "+p.Bridge)
	}
	return st, nil
}

func (f *fakePorts) EnsurePort(ctx context.Context, p hostfw.Port) error {
	if f.fail {
		return errors.New("ip link set: operation not permitted")
	}
	f.out = false
	return nil
}

// TestGuardPlugsTheTapBack: a tap a network restart left out of the
// bridge is plugged back by the next round (the guest's own MAC names
// it); when that fails the guest's link goes down.
func TestGuardPlugsTheTapBack(t *testing.T) {
	r, st := runningRig(t)
	ports := &fakePorts{out: true}
	g := r.guard(io.Discard)
	g.Ports = ports
	r.hv.calls = nil
	if err := g.Once(context.Background()); err != nil {
		t.Fatalf("repair round: %v", err)
	}
	if ports.out {
		t.Errorf("the tap is still out of the bridge after a round")
	}
	if len(ports.got) == 0 || ports.got[0] != (hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC}) {
		t.Errorf("ports checked: %+v, want the instance's bridge and MAC", ports.got)
	}
	if n := strings.Count(strings.Join(r.hv.callList(), " "), "SetLinkDown"); n != 0 {
		t.Errorf("link taken down %d times although the repair worked", n)
	}
	ports.out, ports.fail = true, true
	if err := g.Once(context.Background()); !errors.Is(err, ErrLinkDown) {
		t.Fatalf("Once with a tap that cannot be plugged back = %v, want ErrLinkDown", err)
	}
}
