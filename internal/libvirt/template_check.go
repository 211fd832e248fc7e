package libvirt

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/fsutil"
)

// HostEmulator is the QEMU binary every abox guest runs under: Debian's
// qemu-system-x86 package. A template may name it and nothing else.
const HostEmulator = "/usr/bin/qemu-system-x86_64"

// A user template is checked against an allow list, not a deny list:
// every element and attribute of the domain, of <devices> and of each
// device must be one abox knows to be harmless, or the template is refused
// naming it. libvirt opens the host files a definition names as root
// (serial and console files, disks, firmware and NVRAM templates, fw_cfg
// blobs, ACPI tables, ROMs, sockets), so a host path is accepted only where
// it is one of the instance's own files: its overlay disk, its seed, its
// serial log, the base image's kernel and initrd, and sockets in its run
// directory. An element that a newer libvirtxml adds is refused until
// someone puts it on a list here.

// allowOnly refuses the first field of the struct v (or *struct) that is
// set and not named in allowed (Go field names). where names the element
// for the message, e.g. "<devices>".
func allowOnly(where string, v any, allowed ...string) error {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil
		}
		rv = rv.Elem()
	}
	rt := rv.Type()
	for i := range rt.NumField() {
		f := rt.Field(i)
		if f.Name == "XMLName" || rv.Field(i).IsZero() || slices.Contains(allowed, f.Name) {
			continue
		}
		return fmt.Errorf("%s %s is not allowed in a domain template", where, xmlFieldName(f))
	}
	return nil
}

// xmlFieldName renders a struct field as the XML it stands for:
// <element>, attribute 'name', or the Go name for custom-marshalled parts.
func xmlFieldName(f reflect.StructField) string {
	tag := f.Tag.Get("xml")
	name, opts, _ := strings.Cut(tag, ",")
	switch {
	case name == "" || name == "-":
		return "<" + strings.ToLower(f.Name) + ">"
	case strings.Contains(opts, "attr"):
		return "attribute '" + name + "'"
	}
	return "<" + name + ">"
}

// hostPaths are the host files a template may name, by role.
type hostPaths struct {
	p Params
}

func (h hostPaths) runDir() string {
	if h.p.InstanceDir == "" {
		return ""
	}
	return filepath.Join(h.p.InstanceDir, "run")
}

func checkTemplateDomain(d *libvirtxml.Domain, p Params) error {
	h := hostPaths{p}
	if want := DomainName(p.Name); d.Name != want {
		return fmt.Errorf("domain name is %q, want %q (use {{.DomainName}})", d.Name, want)
	}
	if d.Type != "kvm" && d.Type != "qemu" {
		return fmt.Errorf("domain type %q: want kvm or qemu (use {{.DomainType}})", d.Type)
	}
	if d.QEMUCommandline != nil {
		return fmt.Errorf("<qemu:commandline> is not allowed: it can attach devices outside the packet filter")
	}
	if d.QEMUCapabilities != nil || d.QEMUOverride != nil {
		return fmt.Errorf("<qemu:capabilities> and <qemu:override> are not allowed: they change QEMU devices behind libvirt's back")
	}
	// memoryBacking (file-backed guest RAM), sysinfo (fw_cfg blobs read
	// from host files), blkiotune (host block device paths), bootloader
	// (a host program), launchSecurity, idmap and the hypervisor
	// namespaces are left off on purpose.
	if err := allowOnly("<domain>", d, "Type", "Name", "UUID", "GenID", "Title", "Description", "Metadata",
		"MaximumMemory", "Memory", "CurrentMemory", "MemoryTune", "VCPU", "VCPUs", "IOThreads", "IOThreadIDs",
		"CPUTune", "NUMATune", "OS", "Features", "CPU", "Clock", "OnPoweroff", "OnReboot", "OnCrash",
		"PM", "Perf", "Devices", "SecLabel"); err != nil {
		return err
	}
	for _, sl := range d.SecLabel {
		if sl.Type == "none" {
			return fmt.Errorf("<seclabel type='none'> is not allowed: it runs QEMU unconfined")
		}
		if sl.Type == "static" || sl.Relabel == "no" || sl.Label != "" || sl.ImageLabel != "" {
			return fmt.Errorf("<seclabel> with a static label or relabel='no' is not allowed: only libvirt's dynamic labels confine QEMU")
		}
	}
	if err := checkOS(d.OS, h); err != nil {
		return err
	}
	if d.CPU != nil && d.CPU.Numa != nil {
		for _, c := range d.CPU.Numa.Cell {
			if c.MemAccess == "shared" {
				return fmt.Errorf("<cpu><numa><cell memAccess='shared'> is not allowed: it shares guest memory with host processes")
			}
		}
	}
	dev := d.Devices
	if dev == nil || len(dev.Interfaces) == 0 {
		return fmt.Errorf("no <interface>: the guest needs one on network %q with <filterref filter='{{.FilterName}}'/>", NetworkName(p.Name))
	}
	// Left off: <filesystem> (host directories), <hostdev>, <redirdev>,
	// <smartcard>, <parallel>, <shmem>, <memory> (nvdimm, pmem and
	// virtio-mem backed by host files), <nvram>, <pstore>, <vsock>,
	// <crypto>, <iommu>, <lease>, <hub>.
	if err := allowOnly("<devices>", dev, "Emulator", "Disks", "Controllers", "Interfaces", "Serials",
		"Consoles", "Channels", "Inputs", "TPMs", "Graphics", "Sounds", "Audios", "Videos", "Watchdogs",
		"MemBalloon", "RNGs", "Panics"); err != nil {
		return err
	}
	if dev.Emulator != "" && dev.Emulator != HostEmulator {
		return fmt.Errorf("<emulator> %q is not allowed: guests run under the host's QEMU, %s (leave <emulator> out)", dev.Emulator, HostEmulator)
	}
	for i, nic := range dev.Interfaces {
		if err := checkInterface(nic, p); err != nil {
			return fmt.Errorf("interface %d: %w", i, err)
		}
	}
	for i := range dev.Disks {
		if err := checkDisk(&dev.Disks[i], p); err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
	}
	for i, c := range dev.Controllers {
		if err := allowOnly("<controller>", &c, "Type", "Index", "Model", "Driver", "PCI", "USB", "VirtIOSerial", "ACPI", "Alias", "Address"); err != nil {
			return fmt.Errorf("controller %d: %w", i, err)
		}
	}
	for _, s := range dev.Serials {
		if err := allowOnly("<serial>", &s, "Source", "Target", "ACPI", "Alias", "Address"); err != nil {
			return err
		}
		if err := checkChardev("<serial>", s.Source, h, true); err != nil {
			return err
		}
	}
	for _, c := range dev.Consoles {
		if err := allowOnly("<console>", &c, "Source", "Target", "ACPI", "Alias", "Address"); err != nil {
			return err
		}
		if err := checkChardev("<console>", c.Source, h, true); err != nil {
			return err
		}
	}
	for _, c := range dev.Channels {
		if err := allowOnly("<channel>", &c, "Source", "Target", "ACPI", "Alias", "Address"); err != nil {
			return err
		}
		if c.Target == nil || c.Target.VirtIO == nil {
			return fmt.Errorf("<channel> needs a virtio target: a guestfwd target forwards guest connections to the host")
		}
		if err := checkChardev("<channel>", c.Source, h, false); err != nil {
			return err
		}
	}
	for _, in := range dev.Inputs {
		if in.Source != nil || (in.Type != "mouse" && in.Type != "keyboard" && in.Type != "tablet") {
			return fmt.Errorf("<input type=%q> is not allowed: only mouse, keyboard and tablet without a host source are", in.Type)
		}
	}
	for _, tpm := range dev.TPMs {
		if tpm.Backend == nil || tpm.Backend.Emulator == nil {
			return fmt.Errorf("<tpm> is allowed only with the emulator backend: a passthrough or external TPM is a host device")
		}
	}
	for _, rng := range dev.RNGs {
		b := rng.Backend
		switch {
		case b == nil, b.BuiltIn != nil:
		case b.Random != nil && (b.Random.Device == "" || b.Random.Device == "/dev/urandom" || b.Random.Device == "/dev/random"):
		default:
			return fmt.Errorf("<rng> is allowed only with the builtin backend or /dev/urandom: an egd backend is a socket and another device a host file")
		}
	}
	for _, a := range dev.Audios {
		if a.None == nil && a.SPICE == nil && a.SDL == nil {
			return fmt.Errorf("<audio id='%d'> is not allowed: only types none, spice and sdl are (a sound server or file would carry what the guest plays)", a.ID)
		}
	}
	for i, g := range dev.Graphics {
		if err := checkGraphics(g, h); err != nil {
			return fmt.Errorf("graphics %d: %w", i, err)
		}
	}
	return nil
}

func checkOS(os *libvirtxml.DomainOS, h hostPaths) error {
	if os == nil {
		return nil
	}
	// <loader>, <nvram> (and its template), <varstore>, firmware
	// autoselection, <acpi><table>, <dtb> and <shim> all name host files.
	if err := allowOnly("<os>", os, "Type", "Kernel", "Initrd", "Cmdline", "BootDevices", "BootMenu", "BIOS", "SMBios"); err != nil {
		return err
	}
	if os.SMBios != nil && os.SMBios.Mode != "emulate" {
		return fmt.Errorf("<smbios mode=%q> is not allowed: only emulate (host mode copies the host's SMBIOS data, sysinfo needs <sysinfo>)", os.SMBios.Mode)
	}
	for _, f := range []struct{ what, path, want string }{
		{"<kernel>", os.Kernel, h.p.Kernel},
		{"<initrd>", os.Initrd, h.p.Initrd},
	} {
		if f.path != "" && f.path != f.want {
			return fmt.Errorf("%s %q is not allowed: use the base image's ({{.Kernel}}, {{.Initrd}})", f.what, f.path)
		}
	}
	return nil
}

func checkInterface(nic libvirtxml.DomainInterface, p Params) error {
	if nic.Source == nil || nic.Source.Network == nil || nic.Source.Network.Network != NetworkName(p.Name) {
		return fmt.Errorf("not on network %q (use <interface type='network'> with <source network='{{.NetworkName}}'/>)", NetworkName(p.Name))
	}
	if err := allowOnly("<interface><source>", nic.Source, "Network"); err != nil {
		return err
	}
	if err := allowOnly("<interface><source>", nic.Source.Network, "Network"); err != nil {
		return err
	}
	if nic.FilterRef == nil || nic.FilterRef.Filter != FilterName(p.Name) || len(nic.FilterRef.Parameters) > 0 {
		return fmt.Errorf("does not reference the packet filter (add <filterref filter='{{.FilterName}}'/>, without parameters)")
	}
	// Left off: <script>/<downscript> (host programs run as root),
	// <backend> (host tap and vhost device paths), <rom> (a host file),
	// <target> and managed (an existing host tap), <virtualport>,
	// <vlan>, <ip>, <route>, <portForward>, <bandwidth>, <port>.
	return allowOnly("<interface>", &nic, "MAC", "Source", "Boot", "Model", "Driver", "FilterRef", "Tune",
		"Link", "MTU", "Coalesce", "ACPI", "Alias", "Address")
}

// checkDisk allows exactly the instance's overlay (qcow2) and seed (raw,
// read-only) as plain files, and fills in their format where the template
// leaves it out: a raw overlay would let the guest write a qcow2 header
// naming any host file into a disk abox later opens as qcow2.
func checkDisk(disk *libvirtxml.DomainDisk, p Params) error {
	// Left off: <backingStore> (libvirt then trusts the chain given),
	// <mirror>, <auth>, <encryption>, rawio/sgio and <shareable>.
	if err := allowOnly("<disk>", disk, "Device", "Driver", "Source", "Target", "ReadOnly", "Serial", "WWN",
		"Vendor", "Product", "Boot", "Geometry", "BlockIO", "IOTune", "ACPI", "Alias", "Address"); err != nil {
		return err
	}
	if disk.Device != "" && disk.Device != "disk" && disk.Device != "cdrom" {
		return fmt.Errorf("device %q is not allowed: only disk and cdrom", disk.Device)
	}
	if disk.Source == nil || disk.Source.File == nil {
		return fmt.Errorf("a disk that is not a plain file is not allowed: a block device, host directory, network or storage-pool disk reaches outside the instance")
	}
	if err := allowOnly("<disk><source>", disk.Source, "File", "StartupPolicy", "Index"); err != nil {
		return err
	}
	if err := allowOnly("<disk><source>", disk.Source.File, "File"); err != nil {
		return err
	}
	if disk.Driver == nil {
		disk.Driver = &libvirtxml.DomainDiskDriver{Name: "qemu"}
	}
	want := "raw"
	switch path := disk.Source.File.File; path {
	case p.DiskPath:
		want = "qcow2"
		if disk.ReadOnly != nil {
			return fmt.Errorf("the overlay %s cannot be read-only", path)
		}
	case p.SeedISOPath:
		disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
	default:
		return fmt.Errorf("source file %q is not allowed: a template's disks are the instance's overlay ({{.DiskPath}}) and seed ({{.SeedISOPath}})", path)
	}
	switch disk.Driver.Type {
	case "":
		disk.Driver.Type = want
	case want:
	default:
		return fmt.Errorf("%s is %s, not %q: give <driver name='qemu' type='%s'/> or leave the type out", disk.Source.File.File, want, disk.Driver.Type, want)
	}
	return nil
}

// checkChardev allows a character device to end in a pty, a virtual
// console, nothing, the instance's serial log (file; serial and console
// only, so a guest's output can never overwrite another file) or a UNIX
// socket that QEMU binds in the instance's run directory (abox's own
// channels): never another file, a host device, a pipe, TCP or UDP, or a
// socket it connects to (a host daemon's control socket).
func checkChardev(what string, src *libvirtxml.DomainChardevSource, h hostPaths, serial bool) error {
	switch {
	case src == nil || src.Pty != nil || src.Null != nil || src.VC != nil:
		return nil
	case src.File != nil:
		if !serial || src.File.Path != h.p.SerialLogPath || len(src.File.SecLabel) > 0 {
			return fmt.Errorf("%s to file %q is not allowed: the only file a guest may write is its serial log ({{.SerialLogPath}})", what, src.File.Path)
		}
		return nil
	case src.UNIX != nil:
		u := src.UNIX
		if u.Mode == "bind" && fsutil.Within(u.Path, h.runDir()) && u.Reconnect == nil && len(u.SecLabel) == 0 {
			return nil
		}
		return fmt.Errorf("%s on UNIX socket %q is not allowed: only sockets QEMU binds (mode='bind') in the instance's run directory %s are", what, u.Path, h.runDir())
	}
	return fmt.Errorf("%s: only types pty, vc, null, the serial log file and sockets in the instance's run directory are allowed: any other backend (tcp, udp, pipe, dev, spicevmc, ...) is a channel around the packet filter", what)
}

// checkGraphics allows local displays, and VNC or SPICE only on a UNIX
// socket in the instance's run directory or a loopback address (given
// explicitly: libvirt's default comes from qemu.conf). A display
// reachable from the network is a way in and a way out that the packet
// filter does not see; D-Bus and RDP displays are refused.
func checkGraphics(g libvirtxml.DomainGraphic, h hostPaths) error {
	var listen string
	var listeners []libvirtxml.DomainGraphicListener
	switch {
	case g.SDL != nil, g.Desktop != nil, g.EGLHeadless != nil:
		return nil
	case g.VNC != nil:
		if g.VNC.Socket != "" {
			if !fsutil.Within(g.VNC.Socket, h.runDir()) {
				return fmt.Errorf("vnc socket %q is not allowed: put it in the instance's run directory %s", g.VNC.Socket, h.runDir())
			}
			return nil
		}
		listen, listeners = g.VNC.Listen, g.VNC.Listeners
	case g.Spice != nil:
		listen, listeners = g.Spice.Listen, g.Spice.Listeners
	default:
		return fmt.Errorf("only sdl, desktop, egl-headless, vnc and spice graphics are allowed")
	}
	local := listen == "" || isLoopback(listen)
	if listen == "" && len(listeners) == 0 {
		local = false
	}
	for _, l := range listeners {
		switch {
		case l.Socket != nil && fsutil.Within(l.Socket.Socket, h.runDir()):
		case l.Address != nil && isLoopback(l.Address.Address):
		default:
			local = false
		}
	}
	if !local {
		return fmt.Errorf("vnc and spice must listen on a socket in the instance's run directory or an explicit loopback address (<listen type='address' address='127.0.0.1'/>)")
	}
	return nil
}

func isLoopback(addr string) bool {
	ip, err := netip.ParseAddr(addr)
	return err == nil && ip.IsLoopback()
}
