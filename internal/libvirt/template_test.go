package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

const goodTemplate = `<domain type='{{.DomainType}}'>
  <name>{{.DomainName}}</name>
  <uuid>{{.UUID}}</uuid>
  <memory unit='MiB'>{{.MemoryMiB}}</memory>
  <vcpu>{{.CPUs}}</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <source file='{{.DiskPath}}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='network'>
      <mac address='{{.MAC}}'/>
      <source network='{{.NetworkName}}'/>
      <filterref filter='{{.FilterName}}'/>
    </interface>
  </devices>
</domain>`

func TestRenderTemplate(t *testing.T) {
	tests := []struct {
		name    string
		tmpl    string
		wantErr string
	}{
		{"good", goodTemplate, ""},
		{"no filterref", strings.Replace(goodTemplate, "<filterref filter='{{.FilterName}}'/>", "", 1), "does not reference the packet filter"},
		{"other filter", strings.Replace(goodTemplate, "{{.FilterName}}", "clean-traffic", 1), "does not reference the packet filter"},
		{"second unfiltered nic", strings.Replace(goodTemplate, "</devices>", "<interface type='network'><source network='{{.NetworkName}}'/></interface></devices>", 1), "interface 1"},
		{"nic on default network", strings.Replace(goodTemplate, "<source network='{{.NetworkName}}'/>", "<source network='default'/>", 1), "not on network"},
		{"bridge nic", strings.Replace(goodTemplate, "<interface type='network'>", "<interface type='bridge'>", 1), "not on network"},
		{"no nic", strings.Replace(goodTemplate, "<interface", "<!--", 1), "not a libvirt domain"},
		{"hostdev", strings.Replace(goodTemplate, "</devices>", "<hostdev mode='subsystem' type='pci'/></devices>", 1), "hostdev"},
		{"qemu commandline", strings.Replace(strings.Replace(goodTemplate, "<domain ", "<domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' ", 1), "</devices>", "</devices><qemu:commandline><qemu:arg value='-netdev'/></qemu:commandline>", 1), "qemu:commandline"},
		// Devices that hand the guest a channel around the packet filter.
		{"channel to a host unix socket", addDevice(`<channel type='unix'><source mode='connect' path='/run/docker.sock'/><target type='virtio' name='x'/></channel>`), "<channel>"},
		{"qemu guest agent channel", addDevice(`<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>`), "<channel>"},
		{"spicevmc channel", addDevice(`<channel type='spicevmc'><target type='virtio' name='com.redhat.spice.0'/></channel>`), "<channel>"},
		{"guestfwd channel", addDevice(`<channel type='pty'><target type='guestfwd' address='10.0.2.1' port='4600'/></channel>`), "guestfwd"},
		{"serial over tcp", addDevice(`<serial type='tcp'><source mode='connect' host='192.0.2.1' service='4555'/><target port='1'/></serial>`), "<serial>"},
		{"serial over udp", addDevice(`<serial type='udp'><source mode='connect' host='192.0.2.1' service='53'/><target port='1'/></serial>`), "<serial>"},
		{"console on a host device", addDevice(`<console type='dev'><source path='/dev/ttyUSB0'/><target type='virtio'/></console>`), "<console>"},
		{"parallel to a pipe", addDevice(`<parallel type='pipe'><source path='/tmp/p'/></parallel>`), "<parallel>"},
		{"filesystem", addDevice(`<filesystem type='mount'><source dir='/home'/><target dir='h'/></filesystem>`), "<filesystem>"},
		{"vsock", addDevice(`<vsock model='virtio'><cid auto='yes'/></vsock>`), "<vsock>"},
		{"redirdev", addDevice(`<redirdev bus='usb' type='tcp'><source mode='connect' host='192.0.2.1' service='4000'/></redirdev>`), "<redirdev>"},
		{"smartcard", addDevice(`<smartcard mode='passthrough' type='spicevmc'/>`), "<smartcard>"},
		{"shmem", addDevice(`<shmem name='x'><model type='ivshmem-doorbell'/><server path='/tmp/s'/></shmem>`), "<shmem>"},
		{"network disk", addDevice(`<disk type='network' device='disk'><source protocol='nbd' name='x'><host name='192.0.2.1' port='10809'/></source><target dev='vdc' bus='virtio'/></disk>`), "disk 1"},
		{"network backing store", addDevice(`<disk type='file' device='disk'><source file='/x.qcow2'/><backingStore type='network'><format type='raw'/><source protocol='http' name='/b'><host name='192.0.2.1'/></source></backingStore><target dev='vdc' bus='virtio'/></disk>`), "disk 1"},
		{"host input device", addDevice(`<input type='evdev'><source dev='/dev/input/event0'/></input>`), "<input"},
		{"host input passthrough", addDevice(`<input type='passthrough' bus='virtio'><source evdev='/dev/input/event1'/></input>`), "<input"},
		{"host tpm", addDevice(`<tpm model='tpm-tis'><backend type='passthrough'><device path='/dev/tpm0'/></backend></tpm>`), "<tpm>"},
		{"egd rng", addDevice(`<rng model='virtio'><backend model='egd' type='tcp'><source mode='connect' host='192.0.2.1' service='1234'/></backend></rng>`), "<rng>"},
		{"audio to a sound server", addDevice(`<audio id='1' type='pulseaudio' serverName='tcp:192.0.2.1'/>`), "<audio"},
		{"vnc on every address", addDevice(`<graphics type='vnc' port='5900' listen='0.0.0.0'/>`), "graphics 0"},
		{"spice default listen", addDevice(`<graphics type='spice' autoport='yes'/>`), "graphics 0"},
		{"vnc listener on a network", addDevice(`<graphics type='vnc' autoport='yes'><listen type='network' network='default'/></graphics>`), "graphics 0"},
		{"rdp", addDevice(`<graphics type='rdp' autoport='yes'/>`), "graphics 0"},
		{"dbus display", addDevice(`<graphics type='dbus' address='unix:path=/run/x'/>`), "graphics 0"},
		{"qemu override", qemuNS(`<qemu:override><qemu:device alias='net0'><qemu:frontend><qemu:property name='netdev' type='string' value='x'/></qemu:frontend></qemu:device></qemu:override>`), "qemu:override"},
		{"qemu capabilities", qemuNS(`<qemu:capabilities><qemu:del capability='seccomp-sandbox'/></qemu:capabilities>`), "qemu:capabilities"},
		{"unconfined qemu", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='none'/>", 1), "seclabel"},
		{"qemu as root", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='static' model='dac' relabel='yes'><label>+0:+0</label></seclabel>", 1), "seclabel"},
		// What a template may still have.
		{"file serial and pty console", addDevice(`<serial type='file'><source path='/tmp/s.log'/><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>`), ""},
		{"vnc on a socket and loopback", addDevice(`<graphics type='vnc' socket='/run/v.sock'/><graphics type='spice'><listen type='address' address='127.0.0.1'/></graphics>`), ""},
		{"emulated tpm, random rng, no audio", addDevice(`<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm><rng model='virtio'><backend model='random'>/dev/urandom</backend></rng><audio id='1' type='none'/>`), ""},
		{"wrong name", strings.Replace(goodTemplate, "{{.DomainName}}", "other", 1), "domain name"},
		{"not xml", "hello", "not a libvirt domain"},
		{"unknown field", "{{.Password}}", "rendering"},
		{"bad syntax", "{{", "parsing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, warn, err := RenderTemplate(tt.tmpl, testParams())
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("RenderTemplate: %v", err)
				}
				if warn != TemplateWarning {
					t.Errorf("warning = %q, want TemplateWarning", warn)
				}
				var d libvirtxml.Domain
				if err := d.Unmarshal(out); err != nil {
					t.Fatal(err)
				}
				if d.Devices == nil || len(d.Devices.Interfaces) != 1 || d.Devices.Interfaces[0].FilterRef == nil || d.Devices.Interfaces[0].FilterRef.Filter != "abox-dev" {
					t.Errorf("rendered template lost the filterref:\n%s", out)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("RenderTemplate error = %v, want one containing %q", err, tt.wantErr)
			}
			if out != "" || warn != "" {
				t.Error("a refused template still returned output")
			}
		})
	}
}

func addDevice(xml string) string {
	return strings.Replace(goodTemplate, "</devices>", xml+"</devices>", 1)
}

func qemuNS(xml string) string {
	return strings.Replace(strings.Replace(goodTemplate, "<domain ", "<domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' ", 1), "</devices>", "</devices>"+xml, 1)
}

// TestTemplateDefinesWhatWasChecked: an element libvirtxml does not know
// is invisible to the check, so it must not reach libvirt either; the
// returned XML is the checked document re-encoded.
func TestTemplateDefinesWhatWasChecked(t *testing.T) {
	tmpl := strings.Replace(goodTemplate, "</devices>", "<futuredevice type='tcp' host='192.0.2.1'/></devices><unknownTop/>", 1)
	out, _, err := RenderTemplate(tmpl, testParams())
	if err != nil {
		t.Fatalf("RenderTemplate: %v", err)
	}
	for _, s := range []string{"futuredevice", "unknownTop", "192.0.2.1"} {
		if strings.Contains(out, s) {
			t.Errorf("an element the check cannot see reached the defined XML (%q):\n%s", s, out)
		}
	}
}

// TestTemplateEscapesValues renders hostile paths and cmdline into both
// attribute positions (' and " quoted) and element text and checks the
// parsed values come back unchanged, with no injected elements.
func TestTemplateEscapesValues(t *testing.T) {
	p := testParams()
	p.DiskPath = `/x/a'"><hostdev mode='subsystem'/><disk x='&amp;`
	p.Kernel = "/k"
	p.Cmdline = `a</cmdline><kernel>/evil</kernel><cmdline>&"'`
	tmpl := strings.Replace(goodTemplate, "<os><type arch='x86_64'>hvm</type></os>",
		`<os><type arch="x86_64">hvm</type><kernel>{{.Kernel}}</kernel><cmdline>{{.Cmdline}}</cmdline></os>`, 1)
	tmpl = strings.Replace(tmpl, "<target dev='vda' bus='virtio'/>", `<target dev='vda' bus='virtio'/><serial>{{.DiskPath}}</serial>`, 1)
	tmpl = strings.Replace(tmpl, "</devices>", `<disk type="file" device="disk"><source file="{{.DiskPath}}"/><target dev="vdc" bus="virtio"/></disk></devices>`, 1)
	out, _, err := RenderTemplate(tmpl, p)
	if err != nil {
		t.Fatalf("RenderTemplate: %v", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(out); err != nil {
		t.Fatal(err)
	}
	if len(d.Devices.Hostdevs) != 0 {
		t.Fatal("injected <hostdev> survived escaping")
	}
	if len(d.Devices.Disks) != 2 {
		t.Fatalf("got %d disks, want 2 (an injected disk survived?)", len(d.Devices.Disks))
	}
	for i, disk := range d.Devices.Disks {
		if disk.Source.File.File != p.DiskPath {
			t.Errorf("disk %d path = %q, want %q", i, disk.Source.File.File, p.DiskPath)
		}
	}
	if d.Devices.Disks[0].Serial != p.DiskPath {
		t.Errorf("element text = %q, want %q", d.Devices.Disks[0].Serial, p.DiskPath)
	}
	if d.OS.Cmdline != p.Cmdline || d.OS.Kernel != "/k" {
		t.Errorf("kernel/cmdline = %q/%q", d.OS.Kernel, d.OS.Cmdline)
	}
}
