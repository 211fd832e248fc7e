package libvirt

import (
	"fmt"

	"libvirt.org/go/libvirtxml"
)

// BuildDomain returns the instance's hardened domain definition. What is
// left out matters as much as what is put in: no graphics, video, sound,
// USB, tablet or balloon device means less emulated attack surface and no
// side channel to the host; the only NIC is on the instance network and
// carries the nwfilter, so every way of starting this persistent
// definition (abox, virsh, libvirt autostart after a host reboot) runs the
// guest filtered.
func BuildDomain(p Params) (*libvirtxml.Domain, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	meta, err := metadataXML(p)
	if err != nil {
		return nil, fmt.Errorf("building domain for %q: %w", p.Name, err)
	}
	zero := uint(0)

	d := &libvirtxml.Domain{
		Name:     DomainName(p.Name),
		UUID:     p.UUID,
		Metadata: &libvirtxml.DomainMetadata{XML: meta},
		Memory:   &libvirtxml.DomainMemory{Value: p.MemoryMiB, Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: p.CPUs},
		OS: &libvirtxml.DomainOS{
			Type: &libvirtxml.DomainOSType{Arch: "x86_64", Machine: "q35", Type: "hvm"},
		},
		// ACPI lets an ACPI shutdown reach the guest; a hard power-off
		// soon after first boot loses what cloud-init just wrote (LAB.md).
		// vmport off: QEMU otherwise emulates VMware's backdoor I/O port
		// on pc/q35 machines, an interface no abox guest needs and one
		// more emulated device a hostile guest can probe for bugs.
		Features: &libvirtxml.DomainFeatureList{
			ACPI:   &libvirtxml.DomainFeature{},
			APIC:   &libvirtxml.DomainFeatureAPIC{},
			VMPort: &libvirtxml.DomainFeatureState{State: "off"},
		},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		// A crashed guest stays down rather than restarting unattended.
		OnCrash: "destroy",
		// No suspend: a suspended guest keeps its memory and state around
		// outside abox's control.
		PM: &libvirtxml.DomainPM{
			SuspendToMem:  &libvirtxml.DomainPMPolicy{Enabled: "no"},
			SuspendToDisk: &libvirtxml.DomainPMPolicy{Enabled: "no"},
		},
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				{
					Device: "disk",
					Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "qcow2", Discard: "unmap"},
					Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: p.DiskPath}},
					Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
				},
				{
					// The NoCloud seed as a read-only virtio disk: a CD-ROM
					// would need a SATA/IDE controller, and cloud-init finds
					// the seed by its "cidata" label on any block device.
					Device:   "disk",
					Driver:   &libvirtxml.DomainDiskDriver{Name: "qemu", Type: "raw"},
					Source:   &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: p.SeedISOPath}},
					Target:   &libvirtxml.DomainDiskTarget{Dev: "vdb", Bus: "virtio"},
					ReadOnly: &libvirtxml.DomainDiskReadOnly{},
				},
			},
			Controllers: []libvirtxml.DomainController{
				// libvirt adds a USB controller unless told there is none.
				{Type: "usb", Model: "none"},
			},
			Interfaces: []libvirtxml.DomainInterface{{
				MAC:       &libvirtxml.DomainInterfaceMAC{Address: p.MAC},
				Source:    &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: NetworkName(p.Name)}},
				Model:     &libvirtxml.DomainInterfaceModel{Type: "virtio"},
				FilterRef: &libvirtxml.DomainInterfaceFilterRef{Filter: FilterName(p.Name)},
			}},
			Serials: []libvirtxml.DomainSerial{{
				Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: p.SerialLogPath, Append: "on"}},
				Target: &libvirtxml.DomainSerialTarget{Port: &zero},
			}},
			// The console is the same serial port (libvirt merges them);
			// declaring it keeps `virsh console` and the guest's
			// console=ttyS0 pointing at the log.
			Consoles: []libvirtxml.DomainConsole{{
				Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: p.SerialLogPath, Append: "on"}},
				Target: &libvirtxml.DomainConsoleTarget{Type: "serial", Port: &zero},
			}},
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
			// Guests generate keys (sshd host keys) on first boot; without
			// an entropy source that can stall for minutes under TCG.
			RNGs: []libvirtxml.DomainRNG{{
				Model:   "virtio",
				Backend: &libvirtxml.DomainRNGBackend{Random: &libvirtxml.DomainRNGBackendRandom{Device: "/dev/urandom"}},
			}},
		},
	}

	if p.MonitorSocket != "" {
		d.Devices.Channels = []libvirtxml.DomainChannel{MonitorChannelDevice(p.MonitorSocket)}
	}

	switch p.Accel {
	case AccelKVM:
		d.Type = "kvm"
		d.CPU = &libvirtxml.DomainCPU{Mode: "host-passthrough", Check: "none"}
	case AccelTCG:
		d.Type = "qemu"
		// qemu64 is QEMU's default model, the one LAB.md's TCG boots
		// used; naming it keeps libvirt from approximating the host CPU
		// (features TCG may not emulate) and makes the guest CPU the same
		// on every machine.
		d.CPU = &libvirtxml.DomainCPU{
			Mode:  "custom",
			Match: "exact",
			Check: "none",
			Model: &libvirtxml.DomainCPUModel{Value: "qemu64", Fallback: "forbid"},
		}
	}

	if p.Kernel != "" {
		d.OS.Kernel = p.Kernel
		d.OS.Initrd = p.Initrd
		d.OS.Cmdline = p.Cmdline
	} else {
		d.OS.BootDevices = []libvirtxml.DomainBootDevice{{Dev: "hd"}}
	}
	return d, nil
}

// MonitorChannel is the virtio-serial port name the guest's monitor
// forwarder writes to (/dev/virtio-ports/MonitorChannel in the guest).
const MonitorChannel = "org.abox.monitor.0"

// MonitorChannelDevice is the runtime monitor's channel: a virtio-serial
// port whose host end is a unix socket that libvirt binds at path. The guest
// can only write bytes into it; the host side reads them as untrusted.
func MonitorChannelDevice(path string) libvirtxml.DomainChannel {
	return libvirtxml.DomainChannel{
		Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: path}},
		Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: MonitorChannel}},
	}
}

// DomainXML is BuildDomain marshalled to libvirt's XML.
func DomainXML(p Params) (string, error) {
	d, err := BuildDomain(p)
	if err != nil {
		return "", err
	}
	s, err := d.Marshal()
	if err != nil {
		return "", fmt.Errorf("encoding domain for %q: %w", p.Name, err)
	}
	return s, nil
}
