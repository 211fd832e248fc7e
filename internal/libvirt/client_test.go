package libvirt

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// fakeRemote mimics libvirtd's answers (including its error codes) for the
// calls Client makes, so the idempotency rules are tested without it.
type fakeRemote struct {
	mu       sync.Mutex
	networks map[string]bool // name -> active
	filters  map[string]bool
	domains  map[string]golibvirt.DomainState
	calls    []string
	block    chan struct{} // when set, DomainCreate waits on it
	domXML   map[string]string
	snaps    map[string][]*fakeSnap // domain -> snapshots, oldest first
	// snapFail, when set, is DomainSnapshotCreateXML's error, returned
	// after the snapshot was recorded (as a libvirt that failed late would).
	snapFail error
	// revertedXML, when set, is the definition a revert brings back
	// (instead of the snapshot's); revertFlags the last revert's flags.
	revertedXML string
	revertFlags uint32
}

func newFake() *fakeRemote {
	return &fakeRemote{networks: map[string]bool{}, filters: map[string]bool{}, domains: map[string]golibvirt.DomainState{}}
}

func lvErr(code golibvirt.ErrorNumber, msg string) error {
	return golibvirt.Error{Code: uint32(code), Message: msg}
}

func (f *fakeRemote) log(s string) { f.calls = append(f.calls, s) }

func (f *fakeRemote) Disconnect() error { return nil }
func (f *fakeRemote) ConnectListAllNetworks(int32, golibvirt.ConnectListAllNetworksFlags) ([]golibvirt.Network, uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var r []golibvirt.Network
	for n := range f.networks {
		r = append(r, golibvirt.Network{Name: n})
	}
	return r, uint32(len(r)), nil
}
func (f *fakeRemote) NetworkLookupByName(name string) (golibvirt.Network, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.networks[name]; !ok {
		return golibvirt.Network{}, lvErr(golibvirt.ErrNoNetwork, "Network not found: no network with matching name '"+name+"'")
	}
	return golibvirt.Network{Name: name}, nil
}
func (f *fakeRemote) NetworkDefineXML(xml string) (golibvirt.Network, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NetworkDefineXML")
	name := between(xml, "<name>", "</name>")
	if _, ok := f.networks[name]; !ok {
		f.networks[name] = false
	}
	return golibvirt.Network{Name: name}, nil
}
func (f *fakeRemote) NetworkCreate(n golibvirt.Network) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NetworkCreate")
	if f.networks[n.Name] {
		return lvErr(golibvirt.ErrOperationInvalid, "network is already active")
	}
	f.networks[n.Name] = true
	return nil
}
func (f *fakeRemote) NetworkIsActive(n golibvirt.Network) (int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	active, ok := f.networks[n.Name]
	if !ok {
		return 0, lvErr(golibvirt.ErrNoNetwork, "no network")
	}
	if active {
		return 1, nil
	}
	return 0, nil
}
func (f *fakeRemote) NetworkDestroy(n golibvirt.Network) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NetworkDestroy")
	if !f.networks[n.Name] {
		return lvErr(golibvirt.ErrOperationInvalid, "network is not active")
	}
	f.networks[n.Name] = false
	return nil
}
func (f *fakeRemote) NetworkUndefine(n golibvirt.Network) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NetworkUndefine")
	delete(f.networks, n.Name)
	return nil
}
func (f *fakeRemote) NetworkGetXMLDesc(n golibvirt.Network, _ uint32) (string, error) {
	return "<network><name>" + n.Name + "</name><ip address='10.10.1.1' prefix='24'/></network>", nil
}
func (f *fakeRemote) NwfilterLookupByName(name string) (golibvirt.Nwfilter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.filters[name] {
		return golibvirt.Nwfilter{}, lvErr(golibvirt.ErrNoNwfilter, "no nwfilter")
	}
	return golibvirt.Nwfilter{Name: name}, nil
}
func (f *fakeRemote) NwfilterDefineXML(xml string) (golibvirt.Nwfilter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NwfilterDefineXML")
	name := between(xml, `name="`, `"`)
	f.filters[name] = true
	return golibvirt.Nwfilter{Name: name}, nil
}
func (f *fakeRemote) NwfilterUndefine(n golibvirt.Nwfilter) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("NwfilterUndefine")
	delete(f.filters, n.Name)
	return nil
}
func (f *fakeRemote) DomainLookupByName(name string) (golibvirt.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.domains[name]; !ok {
		return golibvirt.Domain{}, lvErr(golibvirt.ErrNoDomain, "Domain not found")
	}
	return golibvirt.Domain{Name: name}, nil
}
func (f *fakeRemote) DomainDefineXMLFlags(xml string, flags golibvirt.DomainDefineFlags) (golibvirt.Domain, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainDefineXMLFlags")
	if flags&golibvirt.DomainDefineValidate == 0 {
		return golibvirt.Domain{}, errors.New("test: define without validation")
	}
	name := between(xml, "<name>", "</name>")
	if _, ok := f.domains[name]; !ok {
		f.domains[name] = golibvirt.DomainShutoff
	}
	if f.domXML == nil {
		f.domXML = map[string]string{}
	}
	f.domXML[name] = xml
	return golibvirt.Domain{Name: name}, nil
}
func (f *fakeRemote) DomainCreate(d golibvirt.Domain) error {
	if f.block != nil {
		<-f.block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainCreate")
	if f.domains[d.Name] == golibvirt.DomainRunning {
		return lvErr(golibvirt.ErrOperationInvalid, "domain is already running")
	}
	f.domains[d.Name] = golibvirt.DomainRunning
	return nil
}
func (f *fakeRemote) DomainShutdownFlags(d golibvirt.Domain, flags golibvirt.DomainShutdownFlagValues) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainShutdownFlags")
	if flags != golibvirt.DomainShutdownAcpiPowerBtn {
		return errors.New("test: shutdown not via ACPI")
	}
	if f.domains[d.Name] != golibvirt.DomainRunning {
		return lvErr(golibvirt.ErrOperationInvalid, "domain is not running")
	}
	f.domains[d.Name] = golibvirt.DomainShutoff // the guest obeys at once
	return nil
}
func (f *fakeRemote) DomainDestroy(d golibvirt.Domain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainDestroy")
	if f.domains[d.Name] != golibvirt.DomainRunning {
		return lvErr(golibvirt.ErrOperationInvalid, "domain is not running")
	}
	f.domains[d.Name] = golibvirt.DomainShutoff
	return nil
}
func (f *fakeRemote) DomainUndefineFlags(d golibvirt.Domain, _ golibvirt.DomainUndefineFlagsValues) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainUndefineFlags")
	delete(f.domains, d.Name)
	return nil
}
func (f *fakeRemote) DomainGetState(d golibvirt.Domain, _ uint32) (int32, int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.domains[d.Name]
	if !ok {
		return 0, 0, lvErr(golibvirt.ErrNoDomain, "Domain not found")
	}
	return int32(st), 0, nil
}

func (f *fakeRemote) DomainUpdateDeviceFlags(d golibvirt.Domain, xml string, _ golibvirt.DomainDeviceModifyFlags) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.domains[d.Name]; !ok {
		return lvErr(golibvirt.ErrNoDomain, "Domain not found")
	}
	return nil
}

func between(s, a, b string) string {
	i := strings.Index(s, a)
	if i < 0 {
		return ""
	}
	s = s[i+len(a):]
	return s[:strings.Index(s, b)]
}

// TestClientLifecycleIdempotent runs the orchestrator's sequence twice at
// every step: a repeated call must succeed and do nothing.
func TestClientLifecycleIdempotent(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	c := &Client{r: f}
	p := testParams()
	netXML, _ := NetworkXML(p)
	filterXML, _ := NWFilterXML(p)
	domXML, _ := DomainXML(p)
	name := DomainName(p.Name)

	steps := []struct {
		name string
		do   func() error
	}{
		{"define network", func() error { return c.DefineNetwork(ctx, netXML) }},
		{"start network", func() error { return c.StartNetwork(ctx, NetworkName(p.Name)) }},
		{"define filter", func() error { return c.DefineNWFilter(ctx, filterXML) }},
		{"define domain", func() error { return c.DefineDomain(ctx, domXML) }},
		{"start domain", func() error { return c.StartDomain(ctx, name) }},
		{"shutdown domain", func() error { return c.ShutdownDomain(ctx, name) }},
		{"wait shutoff", func() error { return c.WaitShutoff(ctx, name, time.Millisecond) }},
		{"destroy domain", func() error { return c.DestroyDomain(ctx, name) }},
		{"undefine domain", func() error { return c.UndefineDomain(ctx, name) }},
		{"undefine filter", func() error { return c.UndefineNWFilter(ctx, FilterName(p.Name)) }},
		{"destroy network", func() error { return c.DestroyNetwork(ctx, NetworkName(p.Name)) }},
		{"undefine network", func() error { return c.UndefineNetwork(ctx, NetworkName(p.Name)) }},
	}
	for _, s := range steps {
		for i := 1; i <= 2; i++ {
			if err := s.do(); err != nil {
				t.Fatalf("%s (call %d): %v", s.name, i, err)
			}
		}
	}
	want := "NetworkDefineXML NetworkDefineXML NetworkCreate NwfilterDefineXML NwfilterDefineXML DomainDefineXMLFlags DomainDefineXMLFlags " +
		"DomainCreate DomainShutdownFlags DomainUndefineFlags NwfilterUndefine NetworkDestroy NetworkUndefine"
	if got := strings.Join(f.calls, " "); got != want {
		t.Errorf("libvirt calls:\n got %s\nwant %s", got, want)
	}
	if len(f.domains)+len(f.networks)+len(f.filters) != 0 {
		t.Errorf("objects left behind: %v %v %v", f.domains, f.networks, f.filters)
	}
}

func TestClientMissingObjects(t *testing.T) {
	ctx := context.Background()
	c := &Client{r: newFake()}
	if _, err := c.State(ctx, "abox-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("State of a missing domain = %v, want ErrNotFound", err)
	}
	if _, err := c.NetworkActive(ctx, "abox-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("NetworkActive of a missing network = %v, want ErrNotFound", err)
	}
	if err := c.StartDomain(ctx, "abox-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("StartDomain of a missing domain = %v, want ErrNotFound", err)
	}
	if err := c.StartNetwork(ctx, "abox-nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("StartNetwork of a missing network = %v, want ErrNotFound", err)
	}
	if ok, err := c.NWFilterExists(ctx, "abox-nope"); ok || err != nil {
		t.Errorf("NWFilterExists = %v, %v", ok, err)
	}
}

func TestClientHonoursContext(t *testing.T) {
	f := newFake()
	f.block = make(chan struct{})
	defer close(f.block)
	f.domains["abox-dev"] = golibvirt.DomainShutoff
	c := &Client{r: f}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := c.StartDomain(ctx, "abox-dev")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("StartDomain with a stuck libvirtd = %v, want deadline exceeded", err)
	}
}

func TestClientListNetworks(t *testing.T) {
	f := newFake()
	f.networks["default"] = true
	c := &Client{r: f}
	nets, err := c.ListNetworks(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != 1 || nets[0].Name != "default" || len(nets[0].Subnets) != 1 || nets[0].Subnets[0].String() != "10.10.1.0/24" {
		t.Errorf("ListNetworks = %+v", nets)
	}
}
