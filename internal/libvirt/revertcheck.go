package libvirt

import (
	"encoding/xml"
	"fmt"
	"slices"

	"libvirt.org/go/libvirtxml"
)

// CheckDevices checks a domain definition a revert brings back: the one
// a snapshot keeps (read before the revert: an older abox's, or one
// edited since) and the one libvirt then runs (read while the guest is
// still paused). doc is its XML as libvirt gives it; want is the
// definition abox builds now from p. The definition must pass the allow
// list a template passes (domainAllowList, with what only libvirt writes
// allowed too: it refuses a passed-through or external TPM, <memory>
// devices, evdev inputs, RNG sockets, another <emulator>,
// <qemu:commandline>, <sysinfo> and whatever else a template may not
// hold, element by element), have exactly the instance's filtered NIC
// (CheckNetwork), and reach the host through nothing want does not:
// no disk on another host file, no more shared folders, passed-through
// or redirected devices, smartcards, shared memory, parallel ports,
// displays, serial ports, consoles or channels than want, and none of
// those on another host path or socket.
func CheckDevices(doc string, p Params, want *libvirtxml.Domain) error {
	if err := newChecker(p, true).checkDocument(doc, domainAllowList()); err != nil {
		return err
	}
	var live libvirtxml.Domain
	if err := live.Unmarshal(doc); err != nil {
		return fmt.Errorf("reading the definition the snapshot brings back: %w", err)
	}
	if err := CheckNetwork(&live, p); err != nil {
		return err
	}
	return compareDevices(&live, want)
}

// compareDevices holds live to the host-reaching devices of want.
func compareDevices(live, want *libvirtxml.Domain) error {
	lv, wd := live.Devices, want.Devices
	if lv == nil {
		return nil
	}
	if wd == nil {
		wd = &libvirtxml.DomainDeviceList{}
	}
	var disks, wantDisks []string
	for _, d := range lv.Disks {
		disks = append(disks, diskSource(d))
	}
	for _, d := range wd.Disks {
		wantDisks = append(wantDisks, diskSource(d))
	}
	for _, d := range disks {
		if !slices.Contains(wantDisks, d) {
			return fmt.Errorf("domain %s has a disk on %s, which the instance's definition does not have", live.Name, d)
		}
	}
	counts := []struct {
		what       string
		live, want int
	}{
		{"shared folders (filesystem)", len(lv.Filesystems), len(wd.Filesystems)},
		{"passed-through host devices (hostdev)", len(lv.Hostdevs), len(wd.Hostdevs)},
		{"redirected USB devices (redirdev)", len(lv.RedirDevs), len(wd.RedirDevs)},
		{"smartcards", len(lv.Smartcards), len(wd.Smartcards)},
		{"shared memory devices (shmem)", len(lv.Shmems), len(wd.Shmems)},
		{"parallel ports", len(lv.Parallels), len(wd.Parallels)},
		{"displays (graphics)", len(lv.Graphics), len(wd.Graphics)},
		{"serial ports", len(lv.Serials), len(wd.Serials)},
		{"consoles", len(lv.Consoles), len(wd.Consoles)},
		{"channels", len(lv.Channels), len(wd.Channels)},
	}
	for _, c := range counts {
		if c.live > c.want {
			return fmt.Errorf("domain %s has %d %s, the instance's definition %d", live.Name, c.live, c.what, c.want)
		}
	}
	var wantChar []string
	for _, s := range wd.Serials {
		wantChar = append(wantChar, chardevSource(s.Source))
	}
	for _, s := range wd.Consoles {
		wantChar = append(wantChar, chardevSource(s.Source))
	}
	for _, s := range wd.Channels {
		wantChar = append(wantChar, chardevSource(s.Source))
	}
	var liveChar []string
	for _, s := range lv.Serials {
		liveChar = append(liveChar, chardevSource(s.Source))
	}
	for _, s := range lv.Consoles {
		liveChar = append(liveChar, chardevSource(s.Source))
	}
	for _, s := range lv.Channels {
		liveChar = append(liveChar, chardevSource(s.Source))
	}
	for _, s := range liveChar {
		if !slices.Contains(wantChar, s) {
			return fmt.Errorf("domain %s has a serial port, console or channel on %s, which the instance's definition does not have", live.Name, s)
		}
	}
	return nil
}

// diskSource names what a disk reads on the host.
func diskSource(d libvirtxml.DomainDisk) string {
	switch s := d.Source; {
	case s == nil:
		return "no source"
	case s.File != nil:
		return "file " + s.File.File
	case s.Block != nil:
		return "block device " + s.Block.Dev
	default:
		b, _ := xml.Marshal(s)
		return string(b)
	}
}

// chardevSource names what a character device reaches on the host: a
// pty (libvirt picks it) is the same whatever its path.
func chardevSource(s *libvirtxml.DomainChardevSource) string {
	switch {
	case s == nil:
		return "no source"
	case s.Pty != nil:
		return "a pty"
	case s.Null != nil:
		return "null"
	case s.UNIX != nil:
		return "unix socket " + s.UNIX.Path
	case s.File != nil:
		return "file " + s.File.Path
	default:
		b, _ := xml.Marshal(s)
		return string(b)
	}
}
