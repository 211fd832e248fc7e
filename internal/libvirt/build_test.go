package libvirt

import (
	"net/netip"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

func TestGoldenDocuments(t *testing.T) {
	kernel := testParams()
	kernel.Kernel = "/var/cache/abox/base/debian-12/vmlinuz"
	kernel.Initrd = "/var/cache/abox/base/debian-12/initrd.img"
	kernel.Cmdline = "root=/dev/vda console=ttyS0"
	kvm := testParams()
	kvm.Accel = AccelKVM

	tests := []struct {
		file  string
		build func(Params) (string, error)
		p     Params
	}{
		{"network.xml", NetworkXML, testParams()},
		{"nwfilter.xml", NWFilterXML, testParams()},
		{"domain-tcg.xml", DomainXML, testParams()},
		{"domain-kvm.xml", DomainXML, kvm},
		{"domain-kernel.xml", DomainXML, kernel},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			got, err := tt.build(tt.p)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tt.file, got+"\n")
		})
	}
}

func TestNetworkIsIsolated(t *testing.T) {
	n, err := BuildNetwork(testParams())
	if err != nil {
		t.Fatal(err)
	}
	if n.Forward != nil {
		t.Errorf("network has <forward mode=%q>: want none (host-only)", n.Forward.Mode)
	}
	if n.DNS == nil || n.DNS.Enable != "no" {
		t.Errorf("network DNS = %+v, want enable='no' (dnsmasq would take port 53)", n.DNS)
	}
	for _, ip := range n.IPs {
		if ip.DHCP != nil {
			t.Errorf("network has DHCP on %s: want none", ip.Address)
		}
		if ip.Family == "ipv6" || strings.Contains(ip.Address, ":") {
			t.Errorf("network has IPv6 address %s: want none", ip.Address)
		}
	}
	if len(n.IPs) != 1 || n.IPs[0].Address != "10.10.5.1" || n.IPs[0].Prefix != 24 {
		t.Errorf("network IPs = %+v, want 10.10.5.1/24", n.IPs)
	}
	if n.Bridge == nil || n.Bridge.Name != "abx-ef260e9aa3c" || n.Bridge.STP != "off" {
		// STP on would hand the guest's BPDUs to the host's STP before
		// the nwfilter's layer-2 drop (TestE2EBridgeIgnoresGuestBPDUs).
		t.Errorf("network bridge = %+v, want STP off", n.Bridge)
	}
}

// TestNWFilterPolicy checks the design's rules by meaning, not text, so
// that a change which keeps the golden file consistent but drops a rule
// still fails here.
func TestNWFilterPolicy(t *testing.T) {
	f, err := BuildNWFilter(testParams())
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "abox-dev" || f.Chain != "root" {
		t.Errorf("filter name/chain = %q/%q", f.Name, f.Chain)
	}
	type key struct{ action, dir, desc string }
	var got []key
	prio := map[int]bool{}
	for _, e := range f.Entries {
		if e.Ref != nil {
			t.Errorf("filter references %q: want a self-contained filter", e.Ref.Filter)
			continue
		}
		r := e.Rule
		if r.Priority == 0 {
			t.Errorf("rule %+v has no explicit priority", r)
		}
		if prio[r.Priority] {
			t.Errorf("priority %d used twice: ordering between them is implicit", r.Priority)
		}
		prio[r.Priority] = true
		got = append(got, key{r.Action, r.Direction, describe(r)})
	}
	want := []key{
		{"drop", "out", "ipv6"},
		{"drop", "in", "ipv6"},
		{"accept", "out", "ip srcmac=52:54:00:ab:cd:ef src=10.10.5.10"},
		{"accept", "in", "ip dst=10.10.5.10"},
		{"accept", "out", "arp srcmac=52:54:00:ab:cd:ef arpsrcmac=52:54:00:ab:cd:ef arpsrcip=10.10.5.10"},
		{"accept", "in", "arp arpdstip=10.10.5.10"},
		{"drop", "out", "any frame"},
		{"drop", "in", "any frame"},
		{"accept", "in", "all state=ESTABLISHED,RELATED"},
		{"accept", "out", "all state=ESTABLISHED,RELATED"},
		{"accept", "in", "tcp dport=22 state=NEW"},
		{"accept", "out", "udp dst=10.10.5.1 dport=53 state=NEW"},
		{"accept", "out", "tcp dst=10.10.5.1 dport=8080 state=NEW"},
		{"accept", "out", "icmp dst=10.10.5.1 state=NEW type=8"},
		{"accept", "out", "tcp dst=10.10.5.1 dport=53 state=NEW"},
		{"drop", "in", "all-ipv6"},
		{"drop", "out", "all-ipv6"},
		{"drop", "in", "all"},
		{"drop", "out", "all"},
	}
	if len(got) != len(want) {
		t.Fatalf("filter has %d rules, want %d:\n%v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("rule %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Priorities must order the rules as listed: libvirt sorts by them,
	// not by document order.
	for i := 1; i < len(f.Entries); i++ {
		if f.Entries[i].Rule.Priority <= f.Entries[i-1].Rule.Priority {
			t.Errorf("rule %d priority %d not above rule %d's %d", i, f.Entries[i].Rule.Priority, i-1, f.Entries[i-1].Rule.Priority)
		}
	}
}

// describe renders the parts of a rule the policy test cares about.
func describe(r *libvirtxml.NWFilterRule) string {
	var parts []string
	add := func(k string, v libvirtxml.NWFilterField) {
		if v.Str != "" {
			parts = append(parts, k+"="+v.Str)
		}
	}
	switch {
	case r.IPv6 != nil:
		return "ipv6"
	case r.IP != nil:
		add("srcmac", r.IP.SrcMACAddr)
		add("src", r.IP.SrcIPAddr)
		add("dst", r.IP.DstIPAddr)
		return strings.Join(append([]string{"ip"}, parts...), " ")
	case r.ARP != nil:
		add("srcmac", r.ARP.SrcMACAddr)
		add("arpsrcmac", r.ARP.ARPSrcMACAddr)
		add("arpsrcip", r.ARP.ARPSrcIPAddr)
		add("arpdstip", r.ARP.ARPDstIPAddr)
		return strings.Join(append([]string{"arp"}, parts...), " ")
	case r.All != nil:
		add("state", r.All.State)
		return strings.Join(append([]string{"all"}, parts...), " ")
	case r.AllIPv6 != nil:
		return "all-ipv6"
	case r.TCP != nil:
		add("dst", r.TCP.DstIPAddr)
		add("dport", r.TCP.DstPortStart)
		add("state", r.TCP.State)
		return strings.Join(append([]string{"tcp"}, parts...), " ")
	case r.UDP != nil:
		add("dst", r.UDP.DstIPAddr)
		add("dport", r.UDP.DstPortStart)
		add("state", r.UDP.State)
		return strings.Join(append([]string{"udp"}, parts...), " ")
	case r.ICMP != nil:
		add("dst", r.ICMP.DstIPAddr)
		add("state", r.ICMP.State)
		add("type", r.ICMP.Type)
		return strings.Join(append([]string{"icmp"}, parts...), " ")
	case r.MAC == nil && r.ARP == nil && r.RARP == nil && r.VLAN == nil && r.STP == nil:
		return "any frame"
	}
	return "unexpected protocol"
}

func TestDomainHardening(t *testing.T) {
	for _, accel := range []Accel{AccelTCG, AccelKVM} {
		t.Run(string(accel), func(t *testing.T) {
			p := testParams()
			p.Accel = accel
			s, err := DomainXML(p)
			if err != nil {
				t.Fatal(err)
			}
			// Round-trip through libvirtxml so the checks see what libvirt will.
			var d libvirtxml.Domain
			if err := d.Unmarshal(s); err != nil {
				t.Fatal(err)
			}
			wantType := map[Accel]string{AccelTCG: "qemu", AccelKVM: "kvm"}[accel]
			if d.Type != wantType {
				t.Errorf("domain type = %q, want %q", d.Type, wantType)
			}
			dev := d.Devices
			if len(dev.Graphics)+len(dev.Videos)+len(dev.Sounds)+len(dev.Inputs)+len(dev.Hostdevs) != 0 {
				t.Errorf("domain has graphics/video/sound/input/hostdev devices")
			}
			if dev.MemBalloon == nil || dev.MemBalloon.Model != "none" {
				t.Errorf("memballoon = %+v, want model none", dev.MemBalloon)
			}
			usbNone := false
			for _, c := range dev.Controllers {
				usbNone = usbNone || (c.Type == "usb" && c.Model == "none")
			}
			if !usbNone {
				t.Error("no <controller type='usb' model='none'/>: libvirt would add a USB controller")
			}
			if len(dev.Interfaces) != 1 {
				t.Fatalf("domain has %d NICs, want 1", len(dev.Interfaces))
			}
			nic := dev.Interfaces[0]
			if nic.FilterRef == nil || nic.FilterRef.Filter != "abox-dev" {
				t.Errorf("NIC filterref = %+v, want abox-dev", nic.FilterRef)
			}
			if nic.Source.Network == nil || nic.Source.Network.Network != "abox-dev" || nic.MAC.Address != p.MAC || nic.Model.Type != "virtio" {
				t.Errorf("NIC = %+v", nic)
			}
			if d.OnCrash != "destroy" || d.Features == nil || d.Features.ACPI == nil {
				t.Errorf("on_crash=%q acpi=%v", d.OnCrash, d.Features)
			}
			if len(dev.RNGs) != 1 || dev.RNGs[0].Backend.Random.Device != "/dev/urandom" {
				t.Errorf("rng = %+v", dev.RNGs)
			}
			if len(dev.Serials) != 1 || dev.Serials[0].Source.File.Path != p.SerialLogPath {
				t.Errorf("serial = %+v", dev.Serials)
			}
			if len(dev.Disks) != 2 || dev.Disks[1].ReadOnly == nil || dev.Disks[0].Target.Bus != "virtio" {
				t.Errorf("disks = %+v", dev.Disks)
			}
			if d.Metadata == nil || !strings.Contains(d.Metadata.XML, MetadataNamespace) {
				t.Errorf("metadata = %+v, want abox ownership", d.Metadata)
			}
			if d.Features.VMPort == nil || d.Features.VMPort.State != "off" {
				t.Errorf("vmport = %+v, want off (no VMware backdoor port)", d.Features.VMPort)
			}
			// The hardened default must pass the check a user template gets.
			if _, err := checkTemplate(s, p); err != nil {
				t.Errorf("the default domain fails the template check: %v", err)
			}
		})
	}
}

// TestHostileValuesAreEscaped feeds markup through every free-text field
// that Validate lets through (paths, cmdline) and checks that the result
// still parses to the same values: nothing was injected.
func TestHostileValuesAreEscaped(t *testing.T) {
	p := testParams()
	evil := `/tmp/a'"><devices><hostdev/></devices>&x;`
	p.DiskPath = evil + ".qcow2"
	p.SerialLogPath = evil + ".log"
	p.Kernel = evil
	p.Cmdline = `console=ttyS0 '"</cmdline><kernel>/x</kernel>`
	s, err := DomainXML(p)
	if err != nil {
		t.Fatal(err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(s); err != nil {
		t.Fatalf("escaped domain does not parse: %v\n%s", err, s)
	}
	if got := d.Devices.Disks[0].Source.File.File; got != p.DiskPath {
		t.Errorf("disk path = %q, want %q", got, p.DiskPath)
	}
	if d.OS.Cmdline != p.Cmdline || d.OS.Kernel != p.Kernel {
		t.Errorf("kernel/cmdline = %q/%q", d.OS.Kernel, d.OS.Cmdline)
	}
	if len(d.Devices.Hostdevs) != 0 {
		t.Error("injected <hostdev> survived")
	}
}

func TestParamsValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Params)
		wantErr string
	}{
		{"valid", func(*Params) {}, ""},
		{"bad name", func(p *Params) { p.Name = "a'><x" }, "instance name"},
		{"bad uuid", func(p *Params) { p.UUID = "not-a-uuid" }, "uuid"},
		{"bad mac", func(p *Params) { p.MAC = "52:54:00:ab:cd:ef'/>" }, "MAC"},
		{"multicast mac", func(p *Params) { p.MAC = "01:00:5e:00:00:01" }, "multicast"},
		{"long bridge", func(p *Params) { p.Bridge = "abx-0123456789abc" }, "bridge"},
		{"subnet /16", func(p *Params) { p.Subnet = netip.MustParsePrefix("10.10.0.0/16") }, "want a /24"},
		{"gateway outside", func(p *Params) { p.Gateway = p.Gateway.Prev().Prev() }, "gateway"},
		{"guest = gateway", func(p *Params) { p.GuestIP = p.Gateway }, "must differ"},
		{"guest broadcast", func(p *Params) { p.GuestIP = mustAddr("10.10.5.255") }, "guest ip"},
		{"no proxy", func(p *Params) { p.ProxyPort = 0 }, "proxy port"},
		{"zero cpus", func(p *Params) { p.CPUs = 0 }, "cpus"},
		{"tiny memory", func(p *Params) { p.MemoryMiB = 64 }, "memory"},
		{"relative disk", func(p *Params) { p.DiskPath = "disk.qcow2" }, "absolute"},
		{"initrd without kernel", func(p *Params) { p.Initrd = "/boot/initrd" }, "need a kernel"},
		{"auto accel", func(p *Params) { p.Accel = "auto" }, "accel"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testParams()
			tt.mod(&p)
			err := p.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.wantErr)
			}
			// Builders must refuse the same parameters.
			if _, err := DomainXML(p); err == nil {
				t.Error("DomainXML accepted invalid parameters")
			}
			if _, err := NWFilterXML(p); err == nil {
				t.Error("NWFilterXML accepted invalid parameters")
			}
		})
	}
}

func TestDerivedUUIDStable(t *testing.T) {
	a, b := derivedUUID("network", "x"), derivedUUID("network", "x")
	if a != b || a == derivedUUID("nwfilter", "x") || a == derivedUUID("network", "y") {
		t.Errorf("derivedUUID not stable and distinct: %s %s", a, b)
	}
	if !uuidPattern.MatchString(a) {
		t.Errorf("derivedUUID = %q, not a UUID", a)
	}
}
