package libvirt

import (
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// TestCheckDevices: a reverted definition with a device that reaches the
// host beyond the instance's definition (what an older abox's, or an
// edited one, kept in a snapshot) is refused, naming it.
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
		}, "shared folders"},
		{"a disk on a host file", func(d *libvirtxml.Domain) {
			disk := d.Devices.Disks[0]
			disk.Source = &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: "/etc/shadow"}}
			d.Devices.Disks = append(d.Devices.Disks, disk)
		}, "a disk on file /etc/shadow"},
		{"a disk moved to a block device", func(d *libvirtxml.Domain) {
			d.Devices.Disks[0].Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: "/dev/sda"}}
		}, "block device /dev/sda"},
		{"a passed-through device", func(d *libvirtxml.Domain) {
			d.Devices.Hostdevs = append(d.Devices.Hostdevs, libvirtxml.DomainHostdev{})
		}, "host devices"},
		{"a USB redirection", func(d *libvirtxml.Domain) {
			d.Devices.RedirDevs = append(d.Devices.RedirDevs, libvirtxml.DomainRedirDev{Bus: "usb"})
		}, "redirected USB"},
		{"a display", func(d *libvirtxml.Domain) {
			d.Devices.Graphics = append(d.Devices.Graphics, libvirtxml.DomainGraphic{VNC: &libvirtxml.DomainGraphicVNC{}})
		}, "displays"},
		{"shared memory", func(d *libvirtxml.Domain) {
			d.Devices.Shmems = append(d.Devices.Shmems, libvirtxml.DomainShmem{Name: "ivshmem"})
		}, "shared memory"},
		{"a channel to a host socket", func(d *libvirtxml.Domain) {
			d.Devices.Channels = append(d.Devices.Channels, libvirtxml.DomainChannel{Source: unix("/run/docker.sock"),
				Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "x"}}})
		}, "channels"},
		{"the serial port on another host file", func(d *libvirtxml.Domain) {
			d.Devices.Serials[0].Source = &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: "/root/.bashrc"}}
		}, "on file /root/.bashrc"},
		{"the serial port on a TCP socket", func(d *libvirtxml.Domain) {
			d.Devices.Serials[0].Source = &libvirtxml.DomainChardevSource{TCP: &libvirtxml.DomainChardevSourceTCP{Mode: "bind", Host: "0.0.0.0", Service: "4444"}}
		}, "serial port, console or channel on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := testDomain(t)
			if len(want.Devices.Serials) == 0 || len(want.Devices.Disks) == 0 {
				t.Fatal("the test domain has no serial port or disk to edit")
			}
			live := testDomain(t)
			tc.edit(live)
			err := CheckDevices(live, want)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("CheckDevices = %v, want %q", err, tc.want)
			}
		})
	}
}
