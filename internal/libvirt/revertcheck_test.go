package libvirt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// TestCheckDevices: a reverted definition with a device that reaches the
// host beyond the instance's definition (what an older abox's, or an
// edited one, kept in a snapshot), or that no template may have, is
// refused, naming it.
func TestCheckDevices(t *testing.T) {
	unix := func(path string) *libvirtxml.DomainChardevSource {
		return &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: path}}
	}
	for _, tc := range []struct {
		name string
		edit func(d *libvirtxml.Domain)
		want string
	}{
		{"as built", func(*libvirtxml.Domain) {}, ""},
		{"a host folder", func(d *libvirtxml.Domain) {
			d.Devices.Filesystems = append(d.Devices.Filesystems, libvirtxml.DomainFilesystem{
				Source: &libvirtxml.DomainFilesystemSource{Mount: &libvirtxml.DomainFilesystemSourceMount{Dir: "/home"}},
				Target: &libvirtxml.DomainFilesystemTarget{Dir: "home"}})
		}, "<devices><filesystem> is not allowed"},
		{"a disk on a host file", func(d *libvirtxml.Domain) {
			disk := d.Devices.Disks[0]
			disk.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: "/etc/shadow"}}
			d.Devices.Disks = append(d.Devices.Disks, disk)
		}, `"/etc/shadow" is not the instance's overlay or seed`},
		{"a disk moved to a block device", func(d *libvirtxml.Domain) {
			d.Devices.Disks[0].Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: "/dev/sda"}}
		}, "<disk> type 'block' is not allowed"},
		{"a passed-through device", func(d *libvirtxml.Domain) {
			d.Devices.Hostdevs = append(d.Devices.Hostdevs, libvirtxml.DomainHostdev{})
		}, "<devices><hostdev> is not allowed"},
		{"a USB redirection", func(d *libvirtxml.Domain) {
			d.Devices.RedirDevs = append(d.Devices.RedirDevs, libvirtxml.DomainRedirDev{Bus: "usb"})
		}, "<devices><redirdev> is not allowed"},
		{"a display", func(d *libvirtxml.Domain) {
			d.Devices.Graphics = append(d.Devices.Graphics, libvirtxml.DomainGraphic{VNC: &libvirtxml.DomainGraphicVNC{Listen: "127.0.0.1"}})
		}, "displays"},
		// What a template may have is still held to the instance's own.
		{"a second serial port on a socket in run/", func(d *libvirtxml.Domain) {
			d.Devices.Serials = append(d.Devices.Serials, libvirtxml.DomainSerial{Source: unix("/var/lib/abox/instances/dev/run/s.sock")})
		}, "serial ports"},
		{"shared memory", func(d *libvirtxml.Domain) {
			d.Devices.Shmems = append(d.Devices.Shmems, libvirtxml.DomainShmem{Name: "ivshmem"})
		}, "<devices><shmem> is not allowed"},
		{"a channel to a host socket", func(d *libvirtxml.Domain) {
			d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{Source: unix("/run/docker.sock"),
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "x"}}})
		}, "<channel><source> attribute 'path'"},
		{"the serial port on another host file", func(d *libvirtxml.Domain) {
			d.Devices.Serials[0].Source = &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: "/root/.bashrc"}}
		}, `"/root/.bashrc" is not the instance's serial log`},
		{"the serial port on a TCP socket", func(d *libvirtxml.Domain) {
			d.Devices.Serials[0].Source = &libvirtxml.DomainChardevSource{TCP: &libvirtxml.DomainChardevSourceTCP{Mode: "bind", Host: "0.0.0.0", Service: "4444"}}
		}, "<serial> type 'tcp' is not allowed"},
		// Missed while only device counts and sources were compared.
		{"the host's TPM", func(d *libvirtxml.Domain) {
			d.Devices.TPMs = []libvirtxml.DomainTPM{{Model: "tpm-tis", Backend: &libvirtxml.DomainTPMBackend{
				Passthrough: &libvirtxml.DomainTPMBackendPassthrough{Device: &libvirtxml.DomainTPMBackendDevice{Path: "/dev/tpm0"}}}}}
		}, "<tpm><backend> type 'passthrough' is not allowed"},
		{"an emulated TPM's state in a host file", func(d *libvirtxml.Domain) {
			d.Devices.TPMs = []libvirtxml.DomainTPM{{Model: "tpm-crb", Backend: &libvirtxml.DomainTPMBackend{
				Emulator: &libvirtxml.DomainTPMBackendEmulator{Version: "2.0", Source: &libvirtxml.DomainTPMBackendSource{
					File: &libvirtxml.DomainTPMBackendSourceFile{Path: "/etc/shadow"}}}}}}
		}, "<tpm><backend><source> is not allowed"},
		{"an nvdimm on a host file", func(d *libvirtxml.Domain) {
			d.Devices.Memorydevs = []libvirtxml.DomainMemorydev{{Model: "nvdimm",
				Source: &libvirtxml.DomainMemorydevSource{Path: "/etc/shadow"},
				Target: &libvirtxml.DomainMemorydevTarget{Size: &libvirtxml.DomainMemorydevTargetSize{Value: 512, Unit: "MiB"}}}}
		}, "<devices><memory> is not allowed"},
		{"a host input device", func(d *libvirtxml.Domain) {
			d.Devices.Inputs = []libvirtxml.DomainInput{{Type: "evdev", Source: &libvirtxml.DomainInputSource{
				EVDev: &libvirtxml.DomainInputSourceEVDev{Dev: "/dev/input/event0"}}}}
		}, "<input> attribute 'type'"},
		{"an RNG on a socket", func(d *libvirtxml.Domain) {
			d.Devices.RNGs[0].Backend = &libvirtxml.DomainRNGBackend{EGD: &libvirtxml.DomainRNGBackendEGD{
				Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "connect", Path: "/run/x.sock"}}}}
		}, "<rng><backend> model 'egd' is not allowed"},
		{"another emulator", func(d *libvirtxml.Domain) { d.Devices.Emulator = "/tmp/qemu" }, `"/tmp/qemu" is not the host's QEMU`},
		{"qemu:commandline", func(d *libvirtxml.Domain) {
			d.QEMUCommandline = &libvirtxml.DomainQEMUCommandline{Args: []libvirtxml.DomainQEMUCommandlineArg{{Value: "-netdev"}}}
		}, "<qemu:commandline> is not allowed"},
		{"fw_cfg from a host file", func(d *libvirtxml.Domain) {
			d.SysInfo = []libvirtxml.DomainSysInfo{{FWCfg: &libvirtxml.DomainSysInfoFWCfg{
				Entry: []libvirtxml.DomainSysInfoEntry{{Name: "opt/x", File: "/etc/shadow"}}}}}
		}, "<sysinfo> is not allowed"},
		{"a channel over the filter daemon's api.sock", func(d *libvirtxml.Domain) {
			d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{Source: unix("/var/lib/abox/instances/dev/run/api.sock"),
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "x"}}})
		}, "is a path abox itself uses"},
		{"an unconfined QEMU", func(d *libvirtxml.Domain) {
			d.SecLabel = []libvirtxml.DomainSecLabel{{Type: "none"}}
		}, "<seclabel> type 'none' is not allowed"},
		{"an unfiltered NIC", func(d *libvirtxml.Domain) { d.Devices.Interfaces[0].FilterRef = nil }, "packet filter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := testDomain(t)
			if len(want.Devices.Serials) == 0 || len(want.Devices.Disks) == 0 {
				t.Fatal("the test domain has no serial port or disk to edit")
			}
			live := testDomain(t)
			tc.edit(live)
			doc, err := live.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			err = CheckDevices(doc, testParams(), want)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("CheckDevices = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestCheckDevicesTakesLibvirtsOwn: a running abox domain as libvirt 9.0
// reports it (testdata/live-kernel.xml, from `virsh dumpxml` of an e2e
// instance: aliases, addresses, the root ports and SATA controller it
// adds, the tap, the port id, the backing chain it found, its DAC labels)
// passes; what only libvirt writes is still refused in a template.
func TestCheckDevicesTakesLibvirtsOwn(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("testdata", "live-kernel.xml"))
	if err != nil {
		t.Fatal(err)
	}
	p := testParams()
	p.Kernel, p.Initrd = "/var/lib/abox/images/debian-12/kernel", "/var/lib/abox/images/debian-12/initrd.img"
	p.Cmdline = "console=ttyS0 root=/dev/vda rw net.ifnames=0 no_timer_check"
	p.BackingPath = "/var/lib/abox/images/debian-12/disk.qcow2"
	want, err := BuildDomain(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDevices(string(doc), p, want); err != nil {
		t.Errorf("libvirt's own report of abox's domain: %v", err)
	}
	if _, err := checkTemplate(string(doc), p); err == nil || !strings.Contains(err.Error(), "only libvirt") {
		t.Errorf("libvirt's report as a template = %v, want what only libvirt writes refused", err)
	}
	for _, tc := range []struct{ name, from, to, want string }{
		{"a backing file chain of another type", "<backingStore type='file' index='3'>", "<backingStore type='block' index='3'>", "<disk><backingStore> attribute 'type'"},
		// The overlay's header names the backing file: any host file
		// there is read by the guest as its disk.
		{"another backing file", "<source file='/var/lib/abox/images/debian-12/disk.qcow2'/>", "<source file='/etc/shadow'/>", "is not the instance's base image"},
		{"another base's disk", "<source file='/var/lib/abox/images/debian-12/disk.qcow2'/>", "<source file='/var/lib/abox/images/other/disk.qcow2'/>", "is not the instance's base image"},
		{"the base read as raw", "<format type='qcow2'/>\n        <source file='/var/lib/abox/images/debian-12/disk.qcow2'/>", "<format type='raw'/>\n        <source file='/var/lib/abox/images/debian-12/disk.qcow2'/>", "<format> attribute 'type'"},
		{"a chain below the base", "<backingStore/>\n      </backingStore>", "<backingStore type='file' index='4'><format type='raw'/><source file='/etc/shadow'/></backingStore>\n      </backingStore>", "<backingStore><backingStore> attribute"},
		{"the tap on another bridge", "bridge='abx-ef260e9aa3c'", "bridge='virbr0'", "is not the instance's bridge"},
		{"a static label", "<seclabel type='dynamic'", "<seclabel type='static'", "<seclabel> type 'static' is not allowed"},
		{"another emulator", "<emulator>/usr/bin/qemu-system-x86_64</emulator>", "<emulator>/tmp/q</emulator>", "is not the host's QEMU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := strings.Replace(string(doc), tc.from, tc.to, 1)
			if bad == string(doc) {
				t.Fatalf("no %q in the testdata", tc.from)
			}
			if err := CheckDevices(bad, p, want); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckDevices = %v, want %q", err, tc.want)
			}
		})
	}
}
