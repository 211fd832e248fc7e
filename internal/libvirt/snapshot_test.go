package libvirt

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

type fakeSnap struct {
	name, xml string
	current   bool
}

func (f *fakeRemote) DomainGetXMLDesc(d golibvirt.Domain, _ golibvirt.DomainXMLFlags) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.domXML[d.Name]
	if !ok {
		return "", lvErr(golibvirt.ErrNoDomain, "Domain not found")
	}
	return x, nil
}

func (f *fakeRemote) findSnap(d, name string) (int, *fakeSnap) {
	for i, s := range f.snaps[d] {
		if s.name == name {
			return i, s
		}
	}
	return -1, nil
}

func (f *fakeRemote) DomainSnapshotCreateXML(d golibvirt.Domain, xml string, flags uint32) (golibvirt.DomainSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainSnapshotCreateXML")
	if flags&uint32(golibvirt.DomainSnapshotCreateAtomic) == 0 {
		return golibvirt.DomainSnapshot{}, errors.New("test: snapshot without atomic")
	}
	var x libvirtxml.DomainSnapshot
	if err := x.Unmarshal(xml); err != nil {
		return golibvirt.DomainSnapshot{}, lvErr(golibvirt.ErrXMLError, err.Error())
	}
	if _, s := f.findSnap(d.Name, x.Name); s != nil {
		return golibvirt.DomainSnapshot{}, lvErr(golibvirt.ErrOperationInvalid, "snapshot exists")
	}
	x.State = "shutoff"
	if f.domains[d.Name] == golibvirt.DomainRunning {
		x.State = "running"
	}
	x.CreationTime = "1764687845"
	// libvirt keeps the definition the domain has now (the live one).
	if def, ok := f.domXML[d.Name]; ok {
		x.Domain = &libvirtxml.Domain{}
		if err := x.Domain.Unmarshal(def); err != nil {
			return golibvirt.DomainSnapshot{}, lvErr(golibvirt.ErrXMLError, err.Error())
		}
	}
	if n := len(f.snaps[d.Name]); n > 0 {
		x.Parent = &libvirtxml.DomainSnapshotParent{Name: f.snaps[d.Name][n-1].name}
	}
	doc, _ := x.Marshal()
	for _, s := range f.snaps[d.Name] {
		s.current = false
	}
	if f.snaps == nil {
		f.snaps = map[string][]*fakeSnap{}
	}
	f.snaps[d.Name] = append(f.snaps[d.Name], &fakeSnap{name: x.Name, xml: doc, current: true})
	if f.snapFail != nil {
		return golibvirt.DomainSnapshot{}, f.snapFail
	}
	return golibvirt.DomainSnapshot{Name: x.Name, Dom: d}, nil
}

func (f *fakeRemote) DomainSnapshotLookupByName(d golibvirt.Domain, name string, _ uint32) (golibvirt.DomainSnapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, s := f.findSnap(d.Name, name); s == nil {
		return golibvirt.DomainSnapshot{}, lvErr(golibvirt.ErrNoDomainSnapshot, "Domain snapshot not found: no domain snapshot with matching name '"+name+"'")
	}
	return golibvirt.DomainSnapshot{Name: name, Dom: d}, nil
}

func (f *fakeRemote) DomainListAllSnapshots(d golibvirt.Domain, _ int32, _ uint32) ([]golibvirt.DomainSnapshot, int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var r []golibvirt.DomainSnapshot
	for i := len(f.snaps[d.Name]) - 1; i >= 0; i-- { // newest first: Snapshots sorts
		r = append(r, golibvirt.DomainSnapshot{Name: f.snaps[d.Name][i].name, Dom: d})
	}
	return r, int32(len(r)), nil
}

func (f *fakeRemote) DomainSnapshotGetXMLDesc(s golibvirt.DomainSnapshot, _ uint32) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, x := f.findSnap(s.Dom.Name, s.Name); x != nil {
		return x.xml, nil
	}
	return "", lvErr(golibvirt.ErrNoDomainSnapshot, "no snapshot")
}

func (f *fakeRemote) DomainSnapshotIsCurrent(s golibvirt.DomainSnapshot, _ uint32) (int32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, x := f.findSnap(s.Dom.Name, s.Name); x != nil && x.current {
		return 1, nil
	}
	return 0, nil
}

func (f *fakeRemote) DomainRevertToSnapshot(s golibvirt.DomainSnapshot, flags uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainRevertToSnapshot")
	f.revertFlags = flags
	_, x := f.findSnap(s.Dom.Name, s.Name)
	if x == nil {
		return lvErr(golibvirt.ErrNoDomainSnapshot, "no snapshot")
	}
	for _, o := range f.snaps[s.Dom.Name] {
		o.current = o == x
	}
	f.domains[s.Dom.Name] = golibvirt.DomainShutoff
	if strings.Contains(x.xml, "<state>running</state>") {
		f.domains[s.Dom.Name] = golibvirt.DomainRunning
		if flags&uint32(golibvirt.DomainSnapshotRevertPaused) != 0 {
			f.domains[s.Dom.Name] = golibvirt.DomainPaused
		}
	}
	// The definition libvirt runs is the snapshot's, unless the test
	// says libvirt brings back another.
	var snap libvirtxml.DomainSnapshot
	if err := snap.Unmarshal(x.xml); err == nil && snap.Domain != nil {
		f.domXML[s.Dom.Name], _ = snap.Domain.Marshal()
	}
	if f.revertedXML != "" {
		f.domXML[s.Dom.Name] = f.revertedXML
	}
	return nil
}

func (f *fakeRemote) DomainResume(d golibvirt.Domain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainResume")
	if f.domains[d.Name] != golibvirt.DomainPaused {
		return lvErr(golibvirt.ErrOperationInvalid, "domain is not paused")
	}
	f.domains[d.Name] = golibvirt.DomainRunning
	return nil
}

func (f *fakeRemote) DomainSnapshotDelete(s golibvirt.DomainSnapshot, _ golibvirt.DomainSnapshotDeleteFlags) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log("DomainSnapshotDelete")
	i, x := f.findSnap(s.Dom.Name, s.Name)
	if x == nil {
		return lvErr(golibvirt.ErrNoDomainSnapshot, "no snapshot")
	}
	f.snaps[s.Dom.Name] = append(f.snaps[s.Dom.Name][:i], f.snaps[s.Dom.Name][i+1:]...)
	return nil
}

func testDomain(t *testing.T) *libvirtxml.Domain {
	t.Helper()
	d, err := BuildDomain(testParams())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The snapshot documents: memory and the overlay for a running guest, the
// overlay alone for a stopped one; never the read-only seed.
func TestSnapshotXMLGolden(t *testing.T) {
	for _, tc := range []struct {
		file   string
		active bool
	}{{"snapshot-running.xml", true}, {"snapshot-stopped.xml", false}} {
		t.Run(tc.file, func(t *testing.T) {
			doc, err := SnapshotXML("before-upgrade", `tools & "config" <v2>`, tc.active, testDomain(t))
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, doc+"\n")
			var back libvirtxml.DomainSnapshot
			if err := back.Unmarshal(doc); err != nil {
				t.Fatalf("the document does not parse back: %v", err)
			}
			if back.Description != `tools & "config" <v2>` {
				t.Errorf("description came back as %q", back.Description)
			}
		})
	}
}

func TestSnapshotXMLRefuses(t *testing.T) {
	raw := testDomain(t)
	raw.Devices.Disks[0].Driver.Type = "raw"
	noDisk := testDomain(t)
	noDisk.Devices.Disks = noDisk.Devices.Disks[1:] // the read-only seed alone
	for _, tc := range []struct {
		name, snap, desc string
		dom              *libvirtxml.Domain
		want             string
	}{
		{"raw writable disk", "s1", "", raw, "disk vda is a writable disk that is not a qcow2 file (raw)"},
		{"nothing writable", "s1", "", noDisk, "no writable qcow2 disk"},
		{"xml in the name", "a'/><x", "", testDomain(t), "validating snapshot name"},
		{"path in the name", "../../etc", "", testDomain(t), "validating snapshot name"},
		{"numeric id", "3", "", testDomain(t), "snapshot id"},
		{"newline in the description", "s1", "a\nb", testDomain(t), "printable"},
		{"long description", "s1", strings.Repeat("x", MaxSnapshotDescription+1), testDomain(t), "limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := SnapshotXML(tc.snap, tc.desc, true, tc.dom)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("SnapshotXML = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestCheckNetwork(t *testing.T) {
	p := testParams()
	for _, tc := range []struct {
		name string
		edit func(d *libvirtxml.Domain)
		want string
	}{
		{"as built", func(*libvirtxml.Domain) {}, ""},
		{"no filter", func(d *libvirtxml.Domain) { d.Devices.Interfaces[0].FilterRef = nil }, "packet filter"},
		{"another filter", func(d *libvirtxml.Domain) { d.Devices.Interfaces[0].FilterRef.Filter = "allow-all" }, "packet filter"},
		{"filter parameters", func(d *libvirtxml.Domain) {
			d.Devices.Interfaces[0].FilterRef.Parameters = []libvirtxml.DomainInterfaceFilterParam{{Name: "IP", Value: "1.2.3.4"}}
		}, "packet filter"},
		{"another network", func(d *libvirtxml.Domain) { d.Devices.Interfaces[0].Source.Network.Network = "default" }, "not on network"},
		{"another MAC", func(d *libvirtxml.Domain) { d.Devices.Interfaces[0].MAC.Address = "52:54:00:00:00:01" }, "MAC"},
		{"a second NIC", func(d *libvirtxml.Domain) {
			d.Devices.Interfaces = append(d.Devices.Interfaces, d.Devices.Interfaces[0])
		}, "2 network interfaces"},
		{"no NIC", func(d *libvirtxml.Domain) { d.Devices.Interfaces = nil }, "0 network interfaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := testDomain(t)
			tc.edit(d)
			err := CheckNetwork(d, p)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("CheckNetwork = %v, want %q", err, tc.want)
			}
		})
	}
}

func snapClient(t *testing.T, state golibvirt.DomainState) (*Client, *fakeRemote, string) {
	t.Helper()
	f := newFake()
	c := &Client{r: f}
	doc, err := DomainXML(testParams())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DefineDomain(context.Background(), doc); err != nil {
		t.Fatal(err)
	}
	name := DomainName(testParams().Name)
	f.domains[name] = state
	return c, f, name
}

func TestClientSnapshots(t *testing.T) {
	ctx := context.Background()
	c, f, dom := snapClient(t, golibvirt.DomainRunning)
	s1, err := c.CreateSnapshot(ctx, dom, "one", "first")
	if err != nil {
		t.Fatal(err)
	}
	if s1.Name != "one" || s1.State != StateRunning || !s1.Memory() || !s1.Current || s1.Description != "first" {
		t.Errorf("created %+v", s1)
	}
	if want := time.Unix(1764687845, 0).UTC(); !s1.Created.Equal(want) {
		t.Errorf("created at %v, want %v", s1.Created, want)
	}
	if !strings.Contains(f.snaps[dom][0].xml, "<memory snapshot=\"internal\"") {
		t.Errorf("a running domain's snapshot has no memory:\n%s", f.snaps[dom][0].xml)
	}
	if _, err := c.CreateSnapshot(ctx, dom, "one", ""); !errors.Is(err, ErrSnapshotExists) {
		t.Errorf("a second snapshot one = %v, want ErrSnapshotExists", err)
	}
	f.domains[dom] = golibvirt.DomainShutoff
	if _, err := c.CreateSnapshot(ctx, dom, "two", ""); err != nil {
		t.Fatal(err)
	}
	list, err := c.Snapshots(ctx, dom)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "one" || list[1].Name != "two" || list[0].Current || !list[1].Current ||
		list[1].State != StateShutoff || list[1].Memory() || list[1].Parent != "one" {
		t.Errorf("Snapshots = %+v", list)
	}
	var checked int
	check := func(doc string) error {
		checked++
		want, err := BuildDomain(testParams())
		if err != nil {
			return err
		}
		return CheckDevices(doc, testParams(), want)
	}
	if err := c.RevertSnapshot(ctx, dom, "one", check); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.State(ctx, dom); st != StateRunning {
		t.Errorf("after reverting to a running snapshot the domain is %s", st)
	}
	if checked != 2 || f.revertFlags != uint32(golibvirt.DomainSnapshotRevertPaused) {
		t.Errorf("checked %d definitions (want the snapshot's and the live one), reverted with flags %d (want paused)", checked, f.revertFlags)
	}
	for _, tc := range []struct {
		what string
		err  error
	}{
		{"revert", c.RevertSnapshot(ctx, dom, "nope", check)},
		{"delete", c.DeleteSnapshot(ctx, dom, "nope")},
		{"revert on a missing domain", c.RevertSnapshot(ctx, "abox-nope", "one", check)},
	} {
		if !errors.Is(tc.err, ErrNotFound) {
			t.Errorf("%s of a missing snapshot = %v, want ErrNotFound", tc.what, tc.err)
		}
	}
	for _, n := range []string{"one", "two"} {
		if err := c.DeleteSnapshot(ctx, dom, n); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := c.Snapshots(ctx, dom); err != nil || len(list) != 0 {
		t.Errorf("after deleting both: %+v, %v", list, err)
	}
}

// A create that libvirt reports as failed after recording the snapshot
// leaves nothing: the client deletes it.
func TestClientCreateSnapshotRollsBack(t *testing.T) {
	ctx := context.Background()
	c, f, dom := snapClient(t, golibvirt.DomainRunning)
	f.snapFail = lvErr(golibvirt.ErrOperationUnsupported, "internal snapshots of a VM with pflash based firmware are not supported")
	_, err := c.CreateSnapshot(ctx, dom, "one", "")
	if err == nil || !strings.Contains(err.Error(), "libvirt refused") || !strings.Contains(err.Error(), "pflash") {
		t.Errorf("CreateSnapshot = %v, want libvirt's refusal", err)
	}
	if len(f.snaps[dom]) != 0 {
		t.Errorf("a failed create left %d snapshots", len(f.snaps[dom]))
	}
	if got := strings.Join(f.calls, " "); !strings.HasSuffix(got, "DomainSnapshotCreateXML DomainSnapshotDelete") {
		t.Errorf("calls %s", got)
	}
}

// TestClientRevertChecksBeforeTheGuestRuns: a memory snapshot whose kept
// definition is refused reverts nothing; one whose live definition
// (libvirt's, after the revert) is refused stays paused, never resumed;
// a disk-only snapshot needs no check and starts nothing.
func TestClientRevertChecksBeforeTheGuestRuns(t *testing.T) {
	ctx := context.Background()
	refuse := func(bad string) func(string) error {
		return func(doc string) error {
			if strings.Contains(doc, bad) {
				return errors.New("refused " + bad)
			}
			return nil
		}
	}

	c, f, dom := snapClient(t, golibvirt.DomainRunning)
	if _, err := c.CreateSnapshot(ctx, dom, "warm", ""); err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	err := c.RevertSnapshot(ctx, dom, "warm", refuse("serial.log"))
	if err == nil || !strings.Contains(err.Error(), "refused before reverting anything") {
		t.Errorf("RevertSnapshot = %v, want the kept definition refused", err)
	}
	if strings.Contains(strings.Join(f.calls, " "), "DomainRevertToSnapshot") {
		t.Errorf("reverted although the kept definition was refused: %v", f.calls)
	}

	f.revertedXML = strings.Replace(f.domXML[dom], "</devices>", "<hostdev mode='subsystem' type='pci'/></devices>", 1)
	err = c.RevertSnapshot(ctx, dom, "warm", refuse("hostdev"))
	if err == nil || !strings.Contains(err.Error(), "paused, never resumed") {
		t.Errorf("RevertSnapshot = %v, want the live definition refused", err)
	}
	if st, _ := c.State(ctx, dom); st != StatePaused || strings.Contains(strings.Join(f.calls, " "), "DomainResume") {
		t.Errorf("a refused guest is %s (calls %v), want paused and never resumed", st, f.calls)
	}
	f.revertedXML = ""

	if err := c.RevertSnapshot(ctx, dom, "warm", nil); err == nil {
		t.Error("a revert without a check ran")
	}

	f.domains[dom] = golibvirt.DomainShutoff
	if _, err := c.CreateSnapshot(ctx, dom, "cold", ""); err != nil {
		t.Fatal(err)
	}
	if err := c.RevertSnapshot(ctx, dom, "cold", refuse("domain")); err != nil {
		t.Errorf("a disk-only revert was checked: %v", err)
	}
	if f.revertFlags != 0 {
		t.Errorf("a disk-only revert had flags %d (paused would start the guest)", f.revertFlags)
	}
}

// TestSnapshotDefinitions: both definitions a snapshot keeps come out as
// libvirt wrote them, the inactive one renamed <domain>.
func TestSnapshotDefinitions(t *testing.T) {
	doc := `<domainsnapshot><name>x</name><state>running</state>
<domain type='kvm'><name>abox-dev</name><devices><serial type='pty'/></devices></domain>
<inactiveDomain type='kvm'><name>abox-dev</name></inactiveDomain>
<inactiveDomain type='kvm'/></domainsnapshot>`
	defs, err := snapshotDefinitions(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`<domain type='kvm'><name>abox-dev</name><devices><serial type='pty'/></devices></domain>`,
		`<domain type='kvm'><name>abox-dev</name></domain>`,
		`<domain type='kvm'/>`,
	}
	if strings.Join(defs, "\n") != strings.Join(want, "\n") {
		t.Errorf("definitions\n%s\nwant\n%s", strings.Join(defs, "\n"), strings.Join(want, "\n"))
	}
}
