package libvirt

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/paths"
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
		{"other filter", strings.Replace(goodTemplate, "{{.FilterName}}", "clean-traffic", 1), "is not the instance's packet filter"},
		{"second unfiltered nic", strings.Replace(goodTemplate, "</devices>", "<interface type='network'><source network='{{.NetworkName}}'/></interface></devices>", 1), "interface 1"},
		{"nic on default network", strings.Replace(goodTemplate, "<source network='{{.NetworkName}}'/>", "<source network='default'/>", 1), "is not the instance's network"},
		{"bridge nic", strings.Replace(goodTemplate, "<interface type='network'>", "<interface type='bridge'>", 1), "<interface> type 'bridge' is not allowed in a domain template: abox guests are on the instance network only"},
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
		{"network disk", addDevice(`<disk type='network' device='disk'><source protocol='nbd' name='x'><host name='192.0.2.1' port='10809'/></source><target dev='vdc' bus='virtio'/></disk>`), "<disk> type 'network' is not allowed in a domain template: a disk that is not a plain file"},
		{"network backing store", addDevice(`<disk type='file' device='disk'><source file='{{.SeedISOPath}}'/><backingStore type='network'><format type='raw'/><source protocol='http' name='/b'><host name='192.0.2.1'/></source></backingStore><target dev='vdc' bus='virtio'/></disk>`), "<disk><backingStore> is not allowed"},
		{"host input device", addDevice(`<input type='evdev'><source dev='/dev/input/event0'/></input>`), "<input"},
		{"host input passthrough", addDevice(`<input type='passthrough' bus='virtio'><source evdev='/dev/input/event1'/></input>`), "<input"},
		{"host tpm", addDevice(`<tpm model='tpm-tis'><backend type='passthrough'><device path='/dev/tpm0'/></backend></tpm>`), "<tpm>"},
		{"egd rng", addDevice(`<rng model='virtio'><backend model='egd' type='tcp'><source mode='connect' host='192.0.2.1' service='1234'/></backend></rng>`), "<rng>"},
		{"audio to a sound server", addDevice(`<audio id='1' type='pulseaudio' serverName='tcp:192.0.2.1'/>`), "<audio"},
		{"vnc on every address", addDevice(`<graphics type='vnc' port='5900' listen='0.0.0.0'/>`), `"0.0.0.0" is not a loopback address`},
		{"spice default listen", addDevice(`<graphics type='spice' autoport='yes'/>`), "graphics 0"},
		{"vnc listener on a network", addDevice(`<graphics type='vnc' autoport='yes'><listen type='network' network='default'/></graphics>`), "<graphics><listen> type 'network' is not allowed"},
		{"rdp", addDevice(`<graphics type='rdp' autoport='yes'/>`), "<graphics> type 'rdp' is not allowed"},
		{"dbus display", addDevice(`<graphics type='dbus' address='unix:path=/run/x'/>`), "<graphics> type 'dbus' is not allowed"},
		{"qemu override", qemuNS(`<qemu:override><qemu:device alias='net0'><qemu:frontend><qemu:property name='netdev' type='string' value='x'/></qemu:frontend></qemu:device></qemu:override>`), "qemu:override"},
		{"qemu capabilities", qemuNS(`<qemu:capabilities><qemu:del capability='seccomp-sandbox'/></qemu:capabilities>`), "qemu:capabilities"},
		{"unconfined qemu", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='none'/>", 1), "seclabel"},
		{"qemu as root", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='static' model='dac' relabel='yes'><label>+0:+0</label></seclabel>", 1), "seclabel"},
		// Accepted whole before the allow list went all the way down.
		{"tpm emulator state in a host file", addDevice(`<tpm model='tpm-crb'><backend type='emulator' version='2.0'><source type='file' path='/etc/shadow'/></backend></tpm>`), "<tpm><backend><source> is not allowed in a domain template: the emulated TPM's state would be a host file"},
		{"tpm emulator state in a host directory", addDevice(`<tpm model='tpm-crb'><backend type='emulator' version='2.0'><source type='dir' path='/root'/></backend></tpm>`), "<tpm><backend><source> is not allowed"},
		{"sdl on the host's display", addDevice(`<graphics type='sdl' display=':0' xauth='/root/.Xauthority'/>`), "<graphics> type 'sdl' is not allowed in a domain template: SDL opens a window on a host X display"},
		{"sdl without a display", addDevice(`<graphics type='sdl'/>`), "<graphics> type 'sdl' is not allowed"},
		{"egl-headless", addDevice(`<graphics type='egl-headless'><gl rendernode='/dev/dri/renderD128'/></graphics>`), "<graphics> type 'egl-headless' is not allowed"},
		{"spice gl on a render node", addDevice(`<graphics type='spice'><listen type='address' address='127.0.0.1'/><gl enable='yes' rendernode='/dev/dri/renderD128'/></graphics>`), "<graphics><gl> is not allowed in a domain template: OpenGL renders on a host GPU"},
		{"video 3d acceleration on a render node", addDevice(`<video><model type='virtio' heads='1'><acceleration accel3d='yes' rendernode='/dev/dri/renderD128'/></model></video>`), "<video><model><acceleration> attribute"},
		{"video 3d acceleration", addDevice(`<video><model type='virtio'><acceleration accel3d='yes'/></model></video>`), "3D acceleration renders on a host GPU"},
		{"sdl audio", addDevice(`<audio id='1' type='sdl' driver='pulseaudio'/>`), "<audio> type 'sdl' is not allowed"},
		{"channel over the filter daemon's api.sock", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/api.sock'/><target type='virtio' name='x'/></channel>`), `socket "/var/lib/abox/instances/dev/run/api.sock" is a path abox itself uses`},
		{"serial over api.sock", addDevice(`<serial type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/api.sock'/><target port='1'/></serial>`), "is a path abox itself uses"},
		{"vnc over api.sock", addDevice(`<graphics type='vnc' socket='/var/lib/abox/instances/dev/run/api.sock'/>`), "is a path abox itself uses"},
		{"spice listener over api.sock", addDevice(`<graphics type='spice'><listen type='socket' socket='/var/lib/abox/instances/dev/run/api.sock'/></graphics>`), "is a path abox itself uses"},
		{"channel over the monitor's socket", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/monitor.sock'/><target type='virtio' name='x'/></channel>`), "is a path abox itself uses"},
		{"channel over the daemon's pid file", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/daemon.pid'/><target type='virtio' name='x'/></channel>`), "is a path abox itself uses"},
		{"channel over the tap lock", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/tap.lock'/><target type='virtio' name='x'/></channel>`), "is a path abox itself uses"},
		{"socket in a subdirectory of run", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/sub/x.sock'/><target type='virtio' name='x'/></channel>`), "put it directly in the instance's run directory"},
		{"socket path not clean", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run//x.sock'/><target type='virtio' name='x'/></channel>`), "put it directly in the instance's run directory"},
		{"unix channel without a source", addDevice(`<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>`), "<channel> is not allowed in a domain template: it needs a <source> element"},
		{"unix socket without a mode", addDevice(`<channel type='unix'><source path='/var/lib/abox/instances/dev/run/x.sock'/><target type='virtio' name='x'/></channel>`), "it needs a mode attribute"},
		{"selinux base label", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='dynamic' model='selinux'><baselabel>system_u:system_r:unconfined_t:s0</baselabel></seclabel>", 1), "<seclabel><baselabel> is not allowed in a domain template: QEMU would run under a label of the template's choosing"},
		{"dynamic label with relabel no", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='dynamic' model='dac' relabel='no'/>", 1), "<seclabel> attribute 'relabel'"},
		{"unknown element deep down", strings.Replace(goodTemplate, "<source file='{{.DiskPath}}'/>", "<source file='{{.DiskPath}}'><futurething mode='x'/></source>", 1), "line 9: <devices><disk><source><futurething> is not allowed in a domain template: abox does not know it to be harmless"},
		{"unknown attribute", strings.Replace(goodTemplate, "<target dev='vda' bus='virtio'/>", "<target dev='vda' bus='virtio' futureattr='x'/>", 1), "line 10: <devices><disk><target> attribute 'futureattr' is not allowed in a domain template"},
		{"unknown top-level element", strings.Replace(goodTemplate, "</devices>", "</devices><unknownTop/>", 1), "<unknownTop> is not allowed"},
		{"unknown device", addDevice(`<futuredevice type='tcp' host='192.0.2.1'/>`), "<devices><futuredevice> is not allowed"},
		{"attribute in a namespace", strings.Replace(goodTemplate, "<domain ", "<domain xmlns:x='urn:x' x:opt='1' ", 1), "<domain> attribute '{urn:x}opt' is not allowed"},
		{"an attribute given twice", strings.Replace(goodTemplate, "<source file='{{.DiskPath}}'/>", "<source file='{{.DiskPath}}' file='/etc/shadow'/>", 1), "attribute 'file' given twice"},
		{"text where none belongs", strings.Replace(goodTemplate, "<devices>", "<devices>/etc/shadow", 1), "<devices> text is not allowed"},
		{"doctype", "<!DOCTYPE domain [<!ENTITY x '/etc/shadow'>]>" + goodTemplate, "<!DOCTYPE> is not allowed"},
		{"a second domain", goodTemplate + goodTemplate, "<domain> after </domain> is not allowed"},
		{"element in another namespace", strings.Replace(goodTemplate, "</devices>", "<x:dev xmlns:x='urn:x'/></devices>", 1), "<devices><{urn:x}dev> is not allowed"},
		{"alias only libvirt writes: the tap", strings.Replace(goodTemplate, "<filterref", "<target dev='vnet0'/><filterref", 1), "<interface><target> is not allowed in a domain template"},
		{"a label only libvirt writes", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='dynamic' model='dac' relabel='yes'><label>+0:+0</label></seclabel>", 1), "<seclabel><label> is not allowed"},
		{"coredump on crash", strings.Replace(goodTemplate, "<devices>", "<on_crash>coredump-destroy</on_crash><devices>", 1), "a core dump is written to a host file"},
		{"watchdog dump", addDevice(`<watchdog model='i6300esb' action='dump'/>`), "dump writes the guest's memory to a host file"},
		{"video through a vhost-user process", addDevice(`<video><model type='virtio'/><driver name='vhostuser'/></video>`), "<video><driver> attribute 'name'"},
		{"rng from a host device", addDevice(`<rng model='virtio'><backend model='random'>/dev/hwrng</backend></rng>`), "<rng><backend>"},
		{"shared numa memory", strings.Replace(goodTemplate, "<os>", "<cpu><numa><cell id='0' cpus='0' memory='1' unit='GiB' memAccess='shared'/></numa></cpu><os>", 1), "memAccess='shared' shares guest memory"},
		{"tpm passthrough", addDevice(`<tpm model='tpm-tis'><backend type='passthrough'><device path='/dev/tpm0'/></backend></tpm>`), "<tpm><backend> type 'passthrough' is not allowed"},
		{"evdev", addDevice(`<input type='evdev'><source dev='/dev/input/event0' grab='all'/></input>`), "<input> attribute 'type'"},
		// What a template may still have.
		{"file serial to the serial log and pty console", addDevice(`<serial type='file'><source path='{{.SerialLogPath}}'/><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>`), ""},
		{"vnc on a socket in the run dir and loopback", addDevice(`<graphics type='vnc' socket='/var/lib/abox/instances/dev/run/v.sock'/><graphics type='spice'><listen type='address' address='127.0.0.1'/></graphics>`), ""},
		{"virtio channel bound in the run dir", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/x.sock'/><target type='virtio' name='org.example.channel.0'/></channel>`), ""},
		{"host emulator", addDevice(`<emulator>/usr/bin/qemu-system-x86_64</emulator>`), ""},
		{"sockets in the run dir at names abox does not use", addDevice(`<serial type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/serial1.sock'/><target port='1'/></serial><graphics type='spice'><listen type='socket' socket='/var/lib/abox/instances/dev/run/spice.sock'/></graphics>`), ""},
		{"a desktop template", desktopTemplate, ""},
		{"seed with its format", addDevice(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{{.SeedISOPath}}'/><target dev='vdb' bus='virtio'/><readonly/></disk>`), ""},
		// Host files a template may not name (libvirt opens them as root).
		{"serial file at another path", addDevice(`<serial type='file'><source path='/etc/cron.d/x'/><target port='1'/></serial>`), `"/etc/cron.d/x" is not the instance's serial log`},
		{"console file over the allowlist", addDevice(`<console type='file'><source path='/var/lib/abox/instances/dev/allowlist.txt'/><target type='serial' port='0'/></console>`), `"/var/lib/abox/instances/dev/allowlist.txt" is not the instance's serial log`},
		{"channel to a file", addDevice(`<channel type='file'><source path='{{.SerialLogPath}}'/><target type='virtio' name='x'/></channel>`), "<channel> type 'file' is not allowed"},
		{"serial log sub-element", addDevice(`<serial type='pty'><log file='/etc/passwd' append='on'/><target port='1'/></serial>`), "<serial><log> is not allowed"},
		{"unix socket connect in the run dir", addDevice(`<channel type='unix'><source mode='connect' path='/var/lib/abox/instances/dev/run/x.sock'/><target type='virtio' name='x'/></channel>`), `"connect": want bind`},
		{"unix socket bound outside", addDevice(`<channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/../allowlist.txt'/><target type='virtio' name='x'/></channel>`), "put it directly in the instance's run directory"},
		{"vnc socket outside the run dir", addDevice(`<graphics type='vnc' socket='/etc/shadow'/>`), "put it directly in the instance's run directory"},
		{"block device disk", addDevice(`<disk type='block' device='disk'><source dev='/dev/sda'/><target dev='vdc' bus='virtio'/></disk>`), "a disk that is not a plain file reaches outside the instance"},
		{"host directory disk", addDevice(`<disk type='dir' device='disk'><source dir='/home'/><target dev='vdc' bus='virtio'/></disk>`), "a disk that is not a plain file reaches outside the instance"},
		{"host file as disk", addDevice(`<disk type='file' device='disk'><source file='/etc/shadow'/><target dev='vdc' bus='virtio'/></disk>`), `"/etc/shadow" is not the instance's overlay or seed`},
		{"allowlist as disk", addDevice(`<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/var/lib/abox/instances/dev/allowlist.txt'/><target dev='vdc' bus='virtio'/></disk>`), "is not the instance's overlay or seed"},
		{"raw overlay", strings.Replace(goodTemplate, "<source file='{{.DiskPath}}'/>", "<driver name='qemu' type='raw'/><source file='{{.DiskPath}}'/>", 1), `not "raw"`},
		{"explicit backing store", addDevice(`<disk type='file' device='disk'><source file='{{.SeedISOPath}}'/><backingStore type='file'><format type='raw'/><source file='/etc/shadow'/></backingStore><target dev='vdc' bus='virtio'/></disk>`), "<backingStore>"},
		{"lun passthrough", addDevice(`<disk type='file' device='lun'><source file='{{.SeedISOPath}}'/><target dev='sdc' bus='scsi'/></disk>`), `"lun": want one of disk, cdrom`},
		{"nvdimm", addDevice(`<memory model='nvdimm'><source><path>/etc/shadow</path></source><target><size unit='KiB'>524288</size><node>0</node></target></memory>`), "<memory>"},
		{"virtio-pmem", addDevice(`<memory model='virtio-pmem' access='shared'><source><path>/tmp/pmem</path></source><target><size unit='MiB'>64</size></target></memory>`), "<memory>"},
		{"pstore", addDevice(`<pstore backend='acpi-erst'><path>/etc/shadow</path><size unit='KiB'>8</size></pstore>`), "<pstore>"},
		{"nvram device", addDevice(`<nvram><address type='spapr-vio' reg='0x3000'/></nvram>`), "<nvram>"},
		{"custom emulator", addDevice(`<emulator>/tmp/evil-qemu</emulator>`), `"/tmp/evil-qemu" is not the host's QEMU`},
		// XML admits C1 controls: the error shows them escaped, not raw.
		{"emulator with a control character", addDevice("<emulator>/tmp/\u009b2J\u202e</emulator>"), `"/tmp/\u009b2J\u202e" is not the host's QEMU`},
		{"fw_cfg blob from a host file", strings.Replace(goodTemplate, "<os>", "<sysinfo type='fwcfg'><entry name='opt/com.example/x' file='/etc/shadow'/></sysinfo><os>", 1), "<sysinfo>"},
		{"nvram template", strings.Replace(goodTemplate, "<os>", "<os><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE.fd</loader><nvram template='/etc/shadow'>/var/lib/abox/instances/dev/vars.fd</nvram>", 1), "<loader>"},
		{"nvram alone", strings.Replace(goodTemplate, "<os>", "<os><nvram template='/etc/shadow'>/tmp/vars.fd</nvram>", 1), "<nvram>"},
		{"acpi table", strings.Replace(goodTemplate, "<os>", "<os><acpi><table type='slic'>/etc/shadow</table></acpi>", 1), "<acpi>"},
		{"other kernel", strings.Replace(goodTemplate, "<os>", "<os><kernel>/etc/shadow</kernel>", 1), `"/etc/shadow" is not the base image's kernel`},
		{"file-backed memory", strings.Replace(goodTemplate, "<os>", "<memoryBacking><source type='file'/></memoryBacking><os>", 1), "<memoryBacking>"},
		{"interface script", strings.Replace(goodTemplate, "<filterref", "<script path='/tmp/x.sh'/><filterref", 1), "<script>"},
		{"interface rom file", strings.Replace(goodTemplate, "<filterref", "<rom file='/etc/shadow'/><filterref", 1), "<rom>"},
		{"interface tap backend", strings.Replace(goodTemplate, "<filterref", "<backend tap='/dev/net/tun' vhost='/dev/vhost-net'/><filterref", 1), "<backend>"},
		{"filterref parameters", strings.Replace(goodTemplate, "<filterref filter='{{.FilterName}}'/>", "<filterref filter='{{.FilterName}}'><parameter name='IP' value='0.0.0.0'/></filterref>", 1), "without parameters"},
		{"static dac label", strings.Replace(goodTemplate, "</devices>", "</devices><seclabel type='static' model='dac' relabel='yes'><label>1000:1000</label></seclabel>", 1), "seclabel"},
		{"lxc domain type", strings.Replace(goodTemplate, "{{.DomainType}}", "lxc", 1), `"lxc": want one of kvm, qemu: use {{.DomainType}}`},
		{"emulated tpm, random rng, no audio", addDevice(`<tpm model='tpm-crb'><backend type='emulator' version='2.0'/></tpm><rng model='virtio'><backend model='random'>/dev/urandom</backend></rng><audio id='1' type='none'/>`), ""},
		{"wrong name", strings.Replace(goodTemplate, "{{.DomainName}}", "other", 1), "domain name"},
		{"not xml", "hello", "a definition is one <domain> element"},
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

// desktopTemplate is what a user wanting a local desktop guest writes:
// every part of it is on the allow list.
var desktopTemplate = `<domain type='{{.DomainType}}'>
  <name>{{.DomainName}}</name>
  <uuid>{{.UUID}}</uuid>
  <title>dev box</title>
  <description>a desktop</description>
  <memory unit='MiB'>{{.MemoryMiB}}</memory>
  <currentMemory unit='MiB'>{{.MemoryMiB}}</currentMemory>
  <vcpu placement='static'>{{.CPUs}}</vcpu>
  <cputune><shares>1024</shares><vcpupin vcpu='0' cpuset='0-1'/></cputune>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <boot dev='hd'/>
    <bootmenu enable='no'/>
    <smbios mode='emulate'/>
  </os>
  <features><acpi/><apic/><vmport state='off'/><hyperv mode='custom'><relaxed state='on'/><spinlocks state='on' retries='8191'/></hyperv><kvm><hidden state='off'/></kvm></features>
  <cpu mode='host-passthrough' check='none' migratable='on'><topology sockets='1' dies='1' cores='{{.CPUs}}' threads='1'/><feature policy='disable' name='svm'/></cpu>
  <clock offset='utc'><timer name='rtc' tickpolicy='catchup'/><timer name='hpet' present='no'/></clock>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <pm><suspend-to-mem enabled='no'/><suspend-to-disk enabled='no'/></pm>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' discard='unmap' cache='none' io='native'/>
      <source file='{{.DiskPath}}'/>
      <target dev='vda' bus='virtio'/>
      <boot order='1'/>
      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='{{.SeedISOPath}}'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <controller type='usb' model='qemu-xhci' ports='15'/>
    <controller type='sata' index='0'/>
    <controller type='pci' index='0' model='pcie-root'/>
    <controller type='pci' index='1' model='pcie-root-port'><model name='pcie-root-port'/><target chassis='1' port='0x10'/></controller>
    <controller type='virtio-serial' index='0'/>
    <interface type='network'>
      <mac address='{{.MAC}}'/>
      <source network='{{.NetworkName}}'/>
      <model type='virtio'/>
      <driver name='vhost' queues='2'/>
      <filterref filter='{{.FilterName}}'/>
      <link state='up'/>
    </interface>
    <serial type='file'><source path='{{.SerialLogPath}}' append='on'/><target type='isa-serial' port='0'><model name='isa-serial'/></target></serial>
    <console type='pty'><target type='virtio' port='1'/></console>
    <channel type='unix'><source mode='bind' path='/var/lib/abox/instances/dev/run/guest.sock'/><target type='virtio' name='org.example.guest.0'/></channel>
    <input type='tablet' bus='usb'/>
    <input type='keyboard' bus='virtio'/>
    <tpm model='tpm-crb'><backend type='emulator' version='2.0'><active_pcr_banks><sha256/></active_pcr_banks></backend></tpm>
    <graphics type='spice' autoport='yes'><listen type='address' address='127.0.0.1'/><image compression='off'/><clipboard copypaste='no'/><filetransfer enable='no'/></graphics>
    <graphics type='vnc' socket='/var/lib/abox/instances/dev/run/vnc.sock'/>
    <sound model='ich9'><audio id='1'/></sound>
    <audio id='1' type='spice'/>
    <video><model type='virtio' heads='1' primary='yes'><acceleration accel3d='no'/></model></video>
    <watchdog model='itco' action='reset'/>
    <memballoon model='virtio'><stats period='10'/></memballoon>
    <rng model='virtio'><rate bytes='1024' period='1000'/><backend model='builtin'/></rng>
    <panic model='isa'/>
  </devices>
  <seclabel type='dynamic' model='apparmor' relabel='yes'/>
</domain>`

func addDevice(xml string) string {
	return strings.Replace(goodTemplate, "</devices>", xml+"</devices>", 1)
}

func qemuNS(xml string) string {
	return strings.Replace(strings.Replace(goodTemplate, "<domain ", "<domain xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0' ", 1), "</devices>", "</devices>"+xml, 1)
}

// TestTemplateDefinesWhatWasChecked: the XML defined is the checked
// document as libvirtxml encodes it, never the rendered text (no comment,
// no processing instruction survives), and it passes the check again.
func TestTemplateDefinesWhatWasChecked(t *testing.T) {
	tmpl := "<?xml version='1.0'?>\n" + strings.Replace(goodTemplate, "</devices>", "<!-- <hostdev mode='subsystem'/> --></devices>", 1)
	out, _, err := RenderTemplate(tmpl, testParams())
	if err != nil {
		t.Fatalf("RenderTemplate: %v", err)
	}
	for _, s := range []string{"hostdev", "<!--", "<?xml"} {
		if strings.Contains(out, s) {
			t.Errorf("the rendered text, not the checked document, reached the defined XML (%q):\n%s", s, out)
		}
	}
	if _, err := checkTemplate(out, testParams()); err != nil {
		t.Errorf("the defined XML fails the check: %v\n%s", err, out)
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

// TestTemplateSocketsAvoidAboxPaths: a template's socket may be bound at
// no path abox itself uses in the run directory (every one paths names,
// now and when one is added), and not where the run directory or the
// socket is a symbolic link.
func TestTemplateSocketsAvoidAboxPaths(t *testing.T) {
	p := testParams()
	f := paths.InstanceIn(p.InstanceDir)
	v := reflect.ValueOf(f)
	n := 0
	for i := range v.NumField() {
		s, ok := v.Field(i).Interface().(string)
		if !ok || filepath.Dir(s) != f.RunDir {
			continue
		}
		n++
		tmpl := addDevice(`<channel type='unix'><source mode='bind' path='` + s + `'/><target type='virtio' name='x'/></channel>`)
		if _, _, err := RenderTemplate(tmpl, p); err == nil || !strings.Contains(err.Error(), "is a path abox itself uses") {
			t.Errorf("a socket over %s (%s): %v", v.Type().Field(i).Name, s, err)
		}
	}
	if n < 5 {
		t.Fatalf("only %d paths of abox's in %s: is paths.InstanceIn still the source?", n, f.RunDir)
	}

	dir := t.TempDir()
	other := t.TempDir()
	if err := os.Symlink(other, filepath.Join(dir, "run")); err != nil {
		t.Fatal(err)
	}
	p.InstanceDir = dir
	tmpl := addDevice(`<channel type='unix'><source mode='bind' path='` + filepath.Join(dir, "run", "x.sock") + `'/><target type='virtio' name='x'/></channel>`)
	if _, _, err := RenderTemplate(tmpl, p); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Errorf("a socket in a run directory that is a link: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "run")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "run"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(dir, "run", "x.sock")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := RenderTemplate(tmpl, p); err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
		t.Errorf("a socket that is a link: %v", err)
	}
}
