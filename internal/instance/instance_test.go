package instance

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"libvirt.org/go/libvirtxml"
)

// fakeHV records calls and keeps defined objects, like libvirtd would.
type fakeHV struct {
	mu       sync.Mutex
	calls    []string
	networks map[string]bool // name -> active
	filters  map[string]bool
	domains  map[string]libvirt.DomainState
	failOn   string // call name that fails
	// startRanThenFail makes StartDomain run the guest and still return an
	// error, as an RPC cut after libvirtd started it does.
	startRanThenFail bool
	netInfo          []libvirt.NetworkInfo
	domXML           map[string]string // name -> last definition
	snaps            map[string][]libvirt.Snapshot
	// revertedXML, when set, is the live definition a revert brings back
	// (libvirt takes it from the snapshot).
	revertedXML string
	// onRevert, when set, runs as RevertSnapshot begins (to look at the
	// layers around the guest at that moment).
	onRevert func()
	// taps are the running domains' host devices (DomainNICs); rebind,
	// when set, runs on RebindNWFilter (the fake firewall's rules back).
	taps   map[string][]string
	rebind func(tap string) error
	// filterXML is each nwfilter's last definition.
	filterXML map[string]string
}

func newFakeHV() *fakeHV {
	return &fakeHV{networks: map[string]bool{}, filters: map[string]bool{}, domains: map[string]libvirt.DomainState{}}
}

func (h *fakeHV) call(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls = append(h.calls, name)
	if h.failOn == name {
		return fmt.Errorf("%s: injected failure", name)
	}
	return nil
}

func xmlName(xml string) string {
	i := strings.Index(xml, "<name>")
	j := strings.Index(xml, "</name>")
	if i < 0 || j < i {
		return ""
	}
	return xml[i+6 : j]
}

func (h *fakeHV) DefineNetwork(ctx context.Context, xml string) error {
	if err := h.call("DefineNetwork"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.networks[xmlName(xml)] = false
	return nil
}
func (h *fakeHV) StartNetwork(ctx context.Context, name string) error {
	if err := h.call("StartNetwork"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.networks[name] = true
	return nil
}
func (h *fakeHV) DestroyNetwork(ctx context.Context, name string) error {
	if err := h.call("DestroyNetwork"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.networks[name]; ok {
		h.networks[name] = false
	}
	return nil
}
func (h *fakeHV) UndefineNetwork(ctx context.Context, name string) error {
	if err := h.call("UndefineNetwork"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.networks, name)
	return nil
}
func (h *fakeHV) ListNetworks(ctx context.Context) ([]libvirt.NetworkInfo, error) {
	return h.netInfo, h.call("ListNetworks")
}
func (h *fakeHV) DefineNWFilter(ctx context.Context, xml string) error {
	if err := h.call("DefineNWFilter"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	i := strings.Index(xml, "name='")
	if i < 0 {
		i = strings.Index(xml, `name="`)
	}
	name := xml[i+6:]
	name = name[:strings.IndexAny(name, `'"`)]
	h.filters[name] = true
	if h.filterXML == nil {
		h.filterXML = map[string]string{}
	}
	h.filterXML[name] = xml
	return nil
}

func (h *fakeHV) NWFilter(ctx context.Context, name string) (*libvirtxml.NWFilter, error) {
	if err := h.call("NWFilter"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	doc, ok := h.filterXML[name]
	if !ok {
		return nil, fmt.Errorf("reading nwfilter %s: %w", name, libvirt.ErrNotFound)
	}
	var nf libvirtxml.NWFilter
	return &nf, nf.Unmarshal(doc)
}
func (h *fakeHV) UndefineNWFilter(ctx context.Context, name string) error {
	if err := h.call("UndefineNWFilter"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.filters, name)
	return nil
}
func (h *fakeHV) DefineDomain(ctx context.Context, xml string) error {
	if err := h.call("DefineDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.domains[xmlName(xml)]; !ok {
		h.domains[xmlName(xml)] = libvirt.StateShutoff
	}
	if h.domXML == nil {
		h.domXML = map[string]string{}
	}
	h.domXML[xmlName(xml)] = xml
	return nil
}
func (h *fakeHV) StartDomain(ctx context.Context, name string) error {
	if err := h.call("StartDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.domains[name] = libvirt.StateRunning
	if h.startRanThenFail {
		return errors.New("StartDomain: the connection broke after the guest started")
	}
	return nil
}
func (h *fakeHV) ShutdownDomain(ctx context.Context, name string) error {
	if err := h.call("ShutdownDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.domains[name] = libvirt.StateShutoff
	return nil
}
func (h *fakeHV) WaitShutoff(ctx context.Context, name string, _ time.Duration) error {
	return h.call("WaitShutoff")
}
func (h *fakeHV) DestroyDomain(ctx context.Context, name string) error {
	if err := h.call("DestroyDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.domains[name]; ok {
		h.domains[name] = libvirt.StateShutoff
	}
	return nil
}
func (h *fakeHV) SetLinkDown(ctx context.Context, domain, network, filter, mac string) error {
	return h.call("SetLinkDown")
}

func (h *fakeHV) DomainNICs(ctx context.Context, name string, live bool) ([]libvirt.NIC, error) {
	if err := h.call("DomainNICs"); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []libvirt.NIC
	for _, t := range h.taps[name] {
		out = append(out, libvirt.NIC{Target: t})
	}
	return out, nil
}

func (h *fakeHV) RebindNWFilter(ctx context.Context, tap string) error {
	if err := h.call("RebindNWFilter"); err != nil {
		return err
	}
	if h.rebind != nil {
		return h.rebind(tap)
	}
	return nil
}

func (h *fakeHV) UndefineDomain(ctx context.Context, name string) error {
	if err := h.call("UndefineDomain"); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.domains, name)
	return nil
}
func (h *fakeHV) State(ctx context.Context, name string) (libvirt.DomainState, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.domains[name]
	if !ok {
		return libvirt.StateNoState, fmt.Errorf("querying domain %s: %w", name, libvirt.ErrNotFound)
	}
	return s, nil
}

func (h *fakeHV) callList() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

type fakeFW struct {
	mu     sync.Mutex
	chains map[string]bool
	last   hostfw.Bridge // what the last Ensure got
	fail   bool
	// ports are the ports EnsurePort got; failPort makes it fail.
	ports    []hostfw.Port
	failPort bool
	// flushed are the taps whose nwfilter kernel rules are gone; the next
	// checkFails listings fail; onCheck runs after each listing.
	flushed    map[string]bool
	checkFails int
	onCheck    func()
}

func (f *fakeFW) CheckNWFilter(ctx context.Context, tap string) (hostfw.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.checkFails > 0 {
		f.checkFails--
		return hostfw.Status{}, errors.New("running ebtables -t nat -L: exit status 4: RULE_DELETE failed")
	}
	if f.onCheck != nil {
		defer f.onCheck()
	}
	var st hostfw.Status
	if f.flushed[tap] {
		st.Problems = append(st.Problems, "ebtables: no jump to libvirt-I-"+tap)
	}
	return st, nil
}

func (f *fakeFW) EnsurePort(ctx context.Context, p hostfw.Port) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failPort {
		return errors.New("iptables: injected port failure")
	}
	if !f.chains[p.Bridge] {
		return fmt.Errorf("fake firewall: port of %s before its chains", p.Bridge)
	}
	f.ports = append(f.ports, p)
	return nil
}

func (f *fakeFW) Ensure(ctx context.Context, b hostfw.Bridge) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("iptables: injected failure")
	}
	if !b.Gateway.Is4() || b.ProxyPort == 0 {
		return fmt.Errorf("fake firewall: incomplete bridge %+v", b)
	}
	f.chains[b.Name] = true
	f.last = b
	return nil
}
func (f *fakeFW) Remove(ctx context.Context, br string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.chains, br)
	return nil
}

type fakeDaemon struct {
	mu      sync.Mutex
	running map[string]bool
	fail    bool
}

func (d *fakeDaemon) Start(ctx context.Context, st State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fail {
		return errors.New("daemon: injected failure")
	}
	d.running[st.Name] = true
	return nil
}
func (d *fakeDaemon) Stop(ctx context.Context, name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.running, name)
	return nil
}
func (d *fakeDaemon) PID(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running[name] {
		return 42
	}
	return 0
}

func (d *fakeDaemon) Filters(ctx context.Context, name string) string {
	if d.PID(name) != 0 {
		return FiltersUp
	}
	return FiltersDown
}

type fakeSeeds struct{ fail bool }

func (s fakeSeeds) WriteSeed(ctx context.Context, path string, in SeedInput) error {
	if s.fail {
		return errors.New("genisoimage: injected failure")
	}
	if in.AuthorizedKey == "" || len(in.CACertPEM) == 0 || in.HostPublicKey == "" {
		return errors.New("seed input incomplete")
	}
	return os.WriteFile(path, []byte("iso"), 0o644)
}

type fakeImages struct{ dir string }

func (f fakeImages) Get(name string) (image.Image, error) {
	if name != "debian-12" {
		return image.Image{}, fmt.Errorf("reading image %s: %w", name, image.ErrNotFound)
	}
	return image.Image{Metadata: image.Metadata{Name: name}, Dir: f.dir}, nil
}

// fakeRun answers `ip -j route` and creates the overlay file for qemu-img.
type fakeRun struct{ routes string }

func (r fakeRun) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	switch name {
	case "ip":
		return []byte(r.routes), nil
	case "qemu-img":
		// Like the real one: by the umask, world-readable.
		return nil, os.WriteFile(args[len(args)-2], []byte("qcow2"), 0o644)
	}
	return nil, fmt.Errorf("unexpected command %s", name)
}

type rig struct {
	m  *Manager
	hv *fakeHV
	fw *fakeFW
	d  *fakeDaemon
}

func newRig(t *testing.T) *rig {
	t.Helper()
	root := t.TempDir()
	hv := newFakeHV()
	fw := &fakeFW{chains: map[string]bool{}}
	d := &fakeDaemon{running: map[string]bool{}}
	return &rig{
		m: &Manager{
			Layout: paths.Layout{Root: root}, Hypervisor: hv, Firewall: fw, Daemon: d,
			Images: fakeImages{dir: filepath.Join(root, "images", "debian-12")},
			Run:    fakeRun{routes: `[{"dst":"default"},{"dst":"10.10.0.0/24"},{"dst":"192.168.1.0/24"}]`},
			Seeds:  fakeSeeds{},
		},
		hv: hv, fw: fw, d: d,
	}
}

func TestCreateDefinesEverything(t *testing.T) {
	r := newRig(t)
	r.hv.netInfo = []libvirt.NetworkInfo{{Name: "default", Subnets: []netip.Prefix{netip.MustParsePrefix("10.10.1.0/24")}}}
	st, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	// 10.10.0.0/24 is a host route and 10.10.1.0/24 another libvirt network.
	if st.Subnet.String() != "10.10.2.0/24" || st.Gateway.String() != "10.10.2.1" || st.GuestIP.String() != "10.10.2.10" {
		t.Errorf("addresses = %s %s %s", st.Subnet, st.Gateway, st.GuestIP)
	}
	if st.Accel != "tcg" || st.MAC == "" || st.Bridge == "" || st.UUID == "" {
		t.Errorf("state = %+v", st)
	}
	got := r.hv.callList()
	want := []string{"ListNetworks", "DefineNetwork", "DefineNWFilter", "DefineDomain"}
	if !slices.Equal(got, want) {
		t.Errorf("calls = %v, want %v (the filter must exist before the domain)", got, want)
	}
	f := r.m.Layout.Instance("dev")
	for _, p := range []string{f.State, f.Disk, f.Seed, f.SSHKey, f.KnownHosts, f.Allowlist, filepath.Join(f.CADir, "ca.crt")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("missing %s: %v", p, err)
		}
	}
	if fi, err := os.Stat(f.SSHKey); err == nil && fi.Mode().Perm() != 0o600 {
		t.Errorf("ssh key mode = %o, want 600", fi.Mode().Perm())
	}
	// Every file of the instance is private (the e2e suite checks a
	// started one too).
	bad, err := CheckPrivate(r.m.Layout, "dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error(b)
	}
	loaded, err := Load(r.m.Layout, "dev")
	if err != nil || loaded.UUID != st.UUID {
		t.Errorf("Load = %+v, %v", loaded, err)
	}
	if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("second create = %v, want exists error", err)
	}
}

func TestCreateRollsBack(t *testing.T) {
	for _, fail := range []string{"DefineNetwork", "DefineNWFilter", "DefineDomain", "seed"} {
		t.Run(fail, func(t *testing.T) {
			r := newRig(t)
			if fail == "seed" {
				r.m.Seeds = fakeSeeds{fail: true}
			} else {
				r.hv.failOn = fail
			}
			_, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"})
			if err == nil {
				t.Fatal("create succeeded")
			}
			if _, err := os.Stat(r.m.Layout.Instance("dev").Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("instance directory left behind: %v", err)
			}
			if len(r.hv.networks)+len(r.hv.filters)+len(r.hv.domains) != 0 {
				t.Errorf("libvirt objects left behind: %v %v %v", r.hv.networks, r.hv.filters, r.hv.domains)
			}
			if sts, _ := ListStates(r.m.Layout); len(sts) != 0 {
				t.Errorf("instances listed after a failed create: %v", sts)
			}
		})
	}
}

func TestCreateValidates(t *testing.T) {
	r := newRig(t)
	tests := []struct {
		spec Spec
		want string
	}{
		{Spec{Name: "1bad"}, "must start with a letter"},
		{Spec{Name: "a'><x"}, ""},
		{Spec{Name: "dev", Base: "nope"}, `base image "nope" is not installed`},
		{Spec{Name: "dev", Accel: "hvf"}, "kvm, tcg or auto"},
		{Spec{Name: "dev", User: "root"}, "user"},
		{Spec{Name: "dev", MemoryMiB: 64}, "memory"},
		{Spec{Name: "dev", Subnet: netip.MustParsePrefix("10.10.0.0/16")}, "/24"},
		{Spec{Name: "dev", Subnet: netip.MustParsePrefix("10.10.0.0/24")}, "in use"},
	}
	for _, tt := range tests {
		t.Run(tt.spec.Name+tt.want, func(t *testing.T) {
			_, _, err := r.m.Create(context.Background(), tt.spec)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Create(%+v) = %v, want error containing %q", tt.spec, err, tt.want)
			}
		})
	}
	if len(r.hv.callList()) > 1 {
		t.Errorf("libvirt touched by invalid creates: %v", r.hv.callList())
	}
}

func TestConcurrentCreatesGetDistinctSubnets(t *testing.T) {
	r := newRig(t)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, err := r.m.Create(context.Background(), Spec{Name: fmt.Sprintf("vm%d", i), Accel: "tcg"})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	sts, _ := ListStates(r.m.Layout)
	seen := map[string]string{}
	for _, s := range sts {
		for _, k := range []string{s.Subnet.String(), s.Bridge, s.MAC} {
			if other, dup := seen[k]; dup {
				t.Errorf("%s and %s share %s", s.Name, other, k)
			}
			seen[k] = s.Name
		}
	}
	if len(sts) != 6 {
		t.Errorf("instances = %d, want 6", len(sts))
	}
}

// A start whose boot call fails after the guest began to run (the RPC cut
// in flight) powers the guest off: a failed start leaves nothing running,
// the filters and network undone around it.
func TestStartFailingAfterTheGuestRanPowersItOff(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	r.hv.startRanThenFail = true
	err := r.m.Start(ctx, "dev")
	if err == nil || !strings.Contains(err.Error(), "powered off") {
		t.Fatalf("start = %v, want its error saying the guest was powered off", err)
	}
	if s := r.hv.domains[libvirt.DomainName("dev")]; s.Active() {
		t.Errorf("the guest is %v after the failed start", s)
	}
	if r.d.PID("dev") != 0 || r.hv.networks["abox-dev"] {
		t.Errorf("failed start left daemon %d / network active %v", r.d.PID("dev"), r.hv.networks["abox-dev"])
	}
}

func TestStartOrderAndRollback(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	r.hv.calls = nil
	r.hv.failOn = "StartDomain"
	if err := r.m.Start(ctx, "dev"); err == nil {
		t.Fatal("start succeeded despite domain failure")
	}
	if r.d.PID("dev") != 0 || r.hv.networks["abox-dev"] {
		t.Errorf("failed start left daemon %d / network active %v", r.d.PID("dev"), r.hv.networks["abox-dev"])
	}
	r.hv.failOn = ""
	r.hv.calls = nil
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	// Every start defines the network, filter and domain again from the
	// state; the guest boots only after its network, firewall chain and
	// filters.
	if got := r.hv.callList(); !slices.Equal(got, []string{"DefineNetwork", "DefineNWFilter", "DefineDomain", "StartNetwork", "StartDomain"}) {
		t.Errorf("calls = %v", got)
	}
	if !r.fw.chains[st.Bridge] || r.d.PID("dev") == 0 {
		t.Errorf("chain %v, daemon %d", r.fw.chains[st.Bridge], r.d.PID("dev"))
	}
	// The host INPUT chain admits the guest's proxy connections only on
	// the instance's own gateway and proxy and capture ports.
	if want := (hostfw.Bridge{Name: st.Bridge, Gateway: st.Gateway, ProxyPort: st.ProxyPort, Guest: st.GuestIP,
		CaptureHTTPPort: CaptureHTTPPort, CaptureTLSPort: CaptureTLSPort}); r.fw.last != want || want.ProxyPort == 0 || !want.Guest.IsValid() {
		t.Errorf("firewall ensured for %+v, want %+v", r.fw.last, want)
	}
	if err := r.m.Start(ctx, "dev"); err == nil || !strings.Contains(err.Error(), "already running") {
		t.Errorf("second start = %v", err)
	}
	if err := r.m.Remove(ctx, "dev", false); err == nil || !strings.Contains(err.Error(), "running") {
		t.Errorf("remove of a running instance = %v", err)
	}
	if err := r.m.Stop(ctx, "dev", StopOptions{}); err != nil {
		t.Fatal(err)
	}
	if r.d.PID("dev") != 0 || r.hv.domains["abox-dev"] != libvirt.StateShutoff {
		t.Errorf("after stop: daemon %d, domain %s", r.d.PID("dev"), r.hv.domains["abox-dev"])
	}
	if err := r.m.Remove(ctx, "dev", false); err != nil {
		t.Fatal(err)
	}
	if len(r.hv.networks)+len(r.hv.filters)+len(r.hv.domains) != 0 || r.fw.chains[st.Bridge] {
		t.Errorf("remove left %v %v %v chain=%v", r.hv.networks, r.hv.filters, r.hv.domains, r.fw.chains)
	}
	if _, err := Load(r.m.Layout, "dev"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Load after remove = %v", err)
	}
}

// TestStartMakesTheTapInertAtOnce: start makes the guest's tap inert
// outside its bridge right after the domain starts (not at the guard's
// first round), and a start whose tap cannot be made inert powers the guest
// off again and rolls back.
func TestStartMakesTheTapInertAtOnce(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if want := (hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC}); len(r.fw.ports) != 1 || r.fw.ports[0] != want || want.GuestMAC == "" {
		t.Errorf("EnsurePort got %+v, want one call for %+v", r.fw.ports, want)
	}
	if err := r.m.Stop(ctx, "dev", StopOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	r.fw.failPort = true
	r.hv.calls = nil
	if err := r.m.Start(ctx, "dev"); err == nil || !strings.Contains(err.Error(), "the guest's tap") {
		t.Fatalf("start with a port failure = %v", err)
	}
	if r.hv.domains["abox-dev"] == libvirt.StateRunning || !slices.Contains(r.hv.callList(), "DestroyDomain") {
		t.Errorf("the guest kept running: %s, calls %v", r.hv.domains["abox-dev"], r.hv.callList())
	}
	if r.d.PID("dev") != 0 || r.hv.networks["abox-dev"] {
		t.Errorf("failed start left daemon %d / network active %v", r.d.PID("dev"), r.hv.networks["abox-dev"])
	}
}

func TestStartFailsClosedWithoutFirewallOrDaemon(t *testing.T) {
	for _, which := range []string{"firewall", "daemon"} {
		t.Run(which, func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); err != nil {
				t.Fatal(err)
			}
			r.fw.fail = which == "firewall"
			r.d.fail = which == "daemon"
			if err := r.m.Start(ctx, "dev"); err == nil {
				t.Fatal("start succeeded")
			}
			if slices.Contains(r.hv.callList(), "StartDomain") {
				t.Error("the guest was booted without its " + which)
			}
		})
	}
}

func TestStartRepairsDeadFilters(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	r.d.Stop(ctx, "dev") // the daemon died for good
	delete(r.fw.chains, st.Bridge)
	r.hv.calls = nil
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatalf("start of a running instance with dead filters: %v", err)
	}
	if r.d.PID("dev") == 0 || !r.fw.chains[st.Bridge] {
		t.Errorf("filters %d, chain %v after repair", r.d.PID("dev"), r.fw.chains[st.Bridge])
	}
	if slices.Contains(r.hv.callList(), "StartDomain") || slices.Contains(r.hv.callList(), "DestroyDomain") {
		t.Errorf("repair touched the guest: %v", r.hv.callList())
	}
}

// filterRecorder keeps the nwfilter XML each define was given.
type filterRecorder struct {
	*fakeHV
	defined []string
}

func (f *filterRecorder) DefineNWFilter(ctx context.Context, xml string) error {
	f.defined = append(f.defined, xml)
	return f.fakeHV.DefineNWFilter(ctx, xml)
}

// TestStartRedefinesTheFilter: every start, including the repair of a
// running guest's dead filters, defines the packet filter this version
// builds from the state before anything else, so an instance whose filter
// is stale or was edited never boots (or keeps running) under it; and a
// start whose filter cannot be defined does not boot the guest.
func TestStartRedefinesTheFilter(t *testing.T) {
	r := newRig(t)
	rec := &filterRecorder{fakeHV: r.hv}
	r.m.Hypervisor = rec
	ctx := context.Background()
	st, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"})
	if err != nil {
		t.Fatal(err)
	}
	want, err := libvirt.NWFilterXML(ParamsOf(r.m.Layout, st))
	if err != nil {
		t.Fatal(err)
	}
	r.hv.failOn = "DefineNWFilter"
	r.hv.calls = nil
	if err := r.m.Start(ctx, "dev"); err == nil {
		t.Fatal("start succeeded although the filter could not be defined")
	}
	if got := r.hv.callList(); !slices.Equal(got, []string{"DefineNetwork", "DefineNWFilter"}) {
		t.Errorf("calls after a failed filter define = %v, want nothing started", got)
	}
	r.hv.failOn = ""
	rec.defined = nil
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if len(rec.defined) != 1 || rec.defined[0] != want {
		t.Errorf("start defined filters %q, want the current one", rec.defined)
	}
	r.d.Stop(ctx, "dev") // the daemon died; start repairs the running guest
	rec.defined = nil
	if err := r.m.Start(ctx, "dev"); err != nil {
		t.Fatal(err)
	}
	if len(rec.defined) != 1 || rec.defined[0] != want {
		t.Errorf("repair defined filters %q, want the current one", rec.defined)
	}
}
