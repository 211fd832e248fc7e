package libvirt

import (
	"fmt"
	"strings"
	"testing"
	"time"

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
		{"file serial to the serial log and pty console", addDevice(`<serial type='file'><source path='{{.SerialLogPath}}'/><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>`), ""},
		{"vnc on a socket in the run dir and loopback", addDevice(`<graphics type='vnc' socket='/var/lib/abox/instances/dev/run/v.sock'/><graphics type='spice'><listen type='address' address='127.0.0.1'/></graphics>`), ""},
		{"virtio channel bound in the run dir", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/monitor.sock'/><target type='virtio' name='org.example.channel.0'/></channel>`), ""},
		{"host emulator", addDevice(`<emulator>/usr/bin/qemu-system-x86_64</emulator>`), ""},
		{"seed with its format", addDevice(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{{.SeedISOPath}}'/><target dev='vdb' bus='virtio'/><readonly/></disk>`), ""},
		// Host files a template may not name (libvirt opens them as root).
		{"serial file at another path", addDevice(`<serial type='file'><source path='/etc/cron.d/x'/><target port='1'/></serial>`), "<serial> to file \"/etc/cron.d/x\""},
		{"console file over the allowlist", addDevice(`<console type='file'><source path='/var/lib/abox/instances/dev/allowlist.txt'/><target type='serial' port='0'/></console>`), "<console> to file"},
		{"channel to a file", addDevice(`<channel type='file'><source path='{{.SerialLogPath}}'/><target type='virtio' name='x'/></channel>`), "<channel> to file"},
		{"serial log sub-element", addDevice(`<serial type='pty'><log file='/etc/passwd' append='on'/><target port='1'/></serial>`), "<serial> <log>"},
		{"unix socket connect in the run dir", addDevice(`<channel type='unix'><source mode='connect' path='/var/lib/abox/instances/dev/run/api.sock'/><target type='virtio' name='x'/></channel>`), "<channel> on UNIX socket"},
		{"unix socket bound outside", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/../allowlist.txt'/><target type='virtio' name='x'/></channel>`), "<channel> on UNIX socket"},
		{"vnc socket outside the run dir", addDevice(`<graphics type='vnc' socket='/etc/shadow'/>`), "vnc socket"},
		{"block device disk", addDevice(`<disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vdc' bus='virtio'/></disk>`), "disk 1: a disk that is not a plain file is not allowed"},
		{"host directory disk", addDevice(`<disk type='dir' device='disk'><source dir='/home'/><target dev='vdc' bus='virtio'/></disk>`), "disk 1: a disk that is not a plain file is not allowed"},
		{"host file as disk", addDevice(`<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vdc' bus='virtio'/></disk>`), "source file \"/etc/shadow\""},
		{"allowlist as disk", addDevice(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/var/lib/abox/instances/dev/allowlist.txt'/><target dev='vdc' bus='virtio'/></disk>`), "source file"},
		{"raw overlay", strings.Replace(goodTemplate, "<source file='{{.DiskPath}}'/>", "<driver name='qemu' type='raw'/><source file='{{.DiskPath}}'/>", 1), `not "raw"`},
		{"explicit backing store", addDevice(`<disk type='file' device='disk'><source file='{{.SeedISOPath}}'/><backingStore type='file'><format type='raw'/><source file='/etc/shadow'/></backingStore><target dev='vdc' bus='virtio'/></disk>`), "<backingStore>"},
		{"lun passthrough", addDevice(`<disk type='file' device='lun'><source file='{{.SeedISOPath}}'/><target dev='sdc' bus='scsi'/></disk>`), "device \"lun\""},
		{"nvdimm", addDevice(`<memory model='nvdimm'><source><path>/etc/shadow</path></source><target><size unit='KiB'>524288</size><node>0</node></target></memory>`), "<memory>"},
		{"virtio-pmem", addDevice(`<memory model='virtio-pmem' access='shared'><source><path>/tmp/pmem</path></source><target><size unit='MiB'>64</size></target></memory>`), "<memory>"},
		{"pstore", addDevice(`<pstore backend='acpi-erst'><path>/etc/shadow</path><size unit='KiB'>8</size></pstore>`), "<pstore>"},
		{"nvram device", addDevice(`<nvram><address type='spapr-vio' reg='0x3000'/></nvram>`), "<nvram>"},
		{"custom emulator", addDevice(`<emulator>/tmp/evil-qemu</emulator>`), `<emulator> "/tmp/evil-qemu"`},
		// XML admits C1 controls: the error shows them escaped, not raw.
		{"emulator with a control character", addDevice("<emulator>/tmp/\u009b2J\u202e</emulator>"), `<emulator> "/tmp/\u009b2J\u202e"`},
		{"fw_cfg blob from a host file", strings.Replace(goodTemplate, "<os>", "<sysinfo type='fwcfg'><entry name='opt/com.example/x' file='/etc/shadow'/></sysinfo><os>", 1), "<sysinfo>"},
		{"nvram template", strings.Replace(goodTemplate, "<os>", "<os><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader><nvram template='/etc/shadow'>/var/lib/abox/instances/dev/vars.fd</nvram>", 1), "<loader>"},
		{"nvram alone", strings.Replace(goodTemplate, "<os>", "<os><nvram template='/etc/shadow'>/tmp/vars.fd</nvram>", 1), "<nvram>"},
		{"acpi table", strings.Replace(goodTemplate, "<os>", "<os><acpi><table type='slic'>/etc/shadow</table></acpi>", 1), "<acpi>"},
		{"other kernel", strings.Replace(goodTemplate, "<os>", "<os><kernel>/etc/shadow</kernel>", 1), `<kernel> "/etc/shadow"`},
		{"file-backed memory", strings.Replace(goodTemplate, "<os>", "<memoryBacking><source type='file'/></memoryBacking><os>", 1), "<memoryBacking>"},
		{"interface script", strings.Replace(goodTemplate, "<filterref", "<script path='/tmp/x.sh'/><filterref", 1), "<script>"},
		{"interface rom file", strings.Replace(goodTemplate, "<filterref", "<rom file='/etc/shadow'/><filterref", 1), "<rom>"},
		{"interface tap backend", strings.Replace(goodTemplate, "<filterref", "<backend tap='/dev/net/tun' vhost='/dev/vhost-net'/><filterref", 1), "<backend>"},
		{"filterref parameters", strings.Replace(goodTemplate, "<filterref filter='{{.FilterName}}'/>", "<filterref filter='{{.FilterName}}'><parameter name='IP' value='0.0.0.0'/></filterref>", 1), "without parameters"},
		{"static dac label", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='static' model='dac' relabel='yes'><label>1000:1000</label></seclabel>", 1), "seclabel"},
		{"lxc domain type", strings.Replace(goodTemplate, "{{.DomainType}}", "lxc", 1), "domain type"},
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

// TestHardenedDomainPassesTemplateCheck: abox's own domain, given as a
// template, passes the allow list, so every device abox itself adds (the
// serial log, the seed, channels in the run directory) stays allowed
// there, and the check is not looser than needed to allow it.
func TestHardenedDomainPassesTemplateCheck(t *testing.T) {
	for _, p := range []Params{testParams(), func() Params {
		p := testParams()
		p.Kernel, p.Initrd, p.Cmdline = "/var/lib/abox/images/deb/vmlinuz", "/var/lib/abox/images/deb/initrd.img", "root=/dev/vda"
		return p
	}()} {
		own, err := DomainXML(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := RenderTemplate(own, p); err != nil {
			t.Errorf("abox's own domain refused as a template: %v", err)
		}
	}
}

// TestTemplateMetadataIsAbox: a template cannot claim to be another
// instance (the libvirt hook finds the instance by the metadata).
func TestTemplateMetadataIsAbox(t *testing.T) {
	tmpl := strings.Replace(goodTemplate, "<memory", `<metadata><instance xmlns="https://github.com/abox-dev/abox/libvirt/v1" name="other" dir="/tmp/fake"/></metadata><memory`, 1)
	out, _, err := RenderTemplate(tmpl, testParams())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "/tmp/fake") || !strings.Contains(out, `dir="/var/lib/abox/instances/dev"`) {
		t.Errorf("metadata not replaced by abox's:\n%s", out)
	}
}

// TestTemplateWorkIsBounded: a template's work grows no faster than its
// text. Templates calling each other (twenty times a level: a 2 KiB
// template rendered 16 MB, one level more 320 MB), ranging over a number
// (nested, it never ends) and printf widths are refused or cut off at
// MaxRenderedBytes, with a message naming why; {{if}} and {{with}} stay.
func TestTemplateWorkIsBounded(t *testing.T) {
	laughs := `{{define "a"}}` + strings.Repeat("x", 100) + `{{end}}`
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f"} {
		laughs += `{{define "` + n + `"}}` + strings.Repeat(`{{template "`+prev+`"}}`, 20) + `{{end}}`
		prev = n
	}
	in := func(s string) string {
		return strings.Replace(goodTemplate, "<vcpu>", "<description>"+s+"</description><vcpu>", 1)
	}
	for _, tc := range []struct{ name, tmpl, wantErr string }{
		{"templates calling templates", laughs + in(`{{template "f"}}`), "{{define}} and {{block}} are not allowed"},
		{"block", in(`{{block "x" .}}{{.Name}}{{end}}`), "{{define}} and {{block}} are not allowed"},
		{"range over a number", in(`{{range 1000000}}{{range 1000000}}{{end}}{{end}}`), "{{range}} is not allowed"},
		{"range inside if", in(`{{if .Name}}{{range 10}}x{{end}}{{end}}`), "{{range}} is not allowed"},
		{"printf widths", in(strings.Repeat(`{{printf "%999999d" 1}}`, 3)), fmt.Sprintf("larger than %d bytes", MaxRenderedBytes)},
		{"if and with", in(`{{if .Kernel}}k{{else}}{{with .Name}}{{.}}{{end}}{{end}}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, _, err := RenderTemplate(tc.tmpl, testParams())
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			t.Logf("%v", time.Since(start))
		})
	}
}
