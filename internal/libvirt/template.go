package libvirt

import (
	"encoding/xml"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"text/template"

	"libvirt.org/go/libvirtxml"
)

// TemplateWarning is shown whenever a user domain template is used.
const TemplateWarning = "overrides.libvirt.template replaces abox's hardened domain definition " +
	"(no graphics/USB/balloon, on_crash destroy, serial log, virtio RNG); " +
	"abox still requires the instance network and its nwfilter on every NIC, but everything else is now up to the template"

// TemplateData holds the values a user domain template may use. Every
// field is already XML-escaped, so {{.DiskPath}} is safe in element text
// and in attributes quoted with ' or ", whatever the value contains; there
// is no way to reach an unescaped value from the template.
type TemplateData struct {
	Name, DomainName, UUID               string
	NetworkName, FilterName, Bridge      string
	Subnet, Gateway, GuestIP, MAC        string
	ProxyPort, CPUs, MemoryMiB           string
	DiskPath, SeedISOPath, SerialLogPath string
	Kernel, Initrd, Cmdline              string
	DomainType                           string // "kvm" or "qemu"
}

func xmlEscape(s string) string {
	var b strings.Builder
	// xml.EscapeText escapes ' " & < > and control characters; it only
	// fails when the writer does, which strings.Builder never does.
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

func templateData(p Params) TemplateData {
	domType := "qemu"
	if p.Accel == AccelKVM {
		domType = "kvm"
	}
	e := xmlEscape
	return TemplateData{
		Name: e(p.Name), DomainName: e(DomainName(p.Name)), UUID: e(p.UUID),
		NetworkName: e(NetworkName(p.Name)), FilterName: e(FilterName(p.Name)), Bridge: e(p.Bridge),
		Subnet: e(p.Subnet.String()), Gateway: e(p.Gateway.String()), GuestIP: e(p.GuestIP.String()), MAC: e(p.MAC),
		ProxyPort: strconv.Itoa(int(p.ProxyPort)), CPUs: strconv.FormatUint(uint64(p.CPUs), 10),
		MemoryMiB: strconv.FormatUint(uint64(p.MemoryMiB), 10),
		DiskPath:  e(p.DiskPath), SeedISOPath: e(p.SeedISOPath), SerialLogPath: e(p.SerialLogPath),
		Kernel: e(p.Kernel), Initrd: e(p.Initrd), Cmdline: e(p.Cmdline),
		DomainType: domType,
	}
}

// RenderTemplate renders a user domain template (overrides.libvirt.template,
// Go text/template syntax over TemplateData) and checks the result. It
// returns the domain XML and TemplateWarning, which the caller must show
// the user. The result is refused unless it parses as a libvirt domain
// named DomainName(p.Name) with at least one NIC, every NIC on the
// instance network and carrying the instance nwfilter, and nothing that
// gives the guest a channel around that filter (see checkTemplateDomain).
//
// The XML returned is the checked document as libvirtxml re-encodes it, not
// the rendered text: an element libvirtxml does not know (a device type
// newer than it, a misspelling libvirt happens to accept) would otherwise
// pass the check unseen and still reach libvirt. What is defined is
// exactly what was checked.
func RenderTemplate(text string, p Params) (domainXML, warning string, err error) {
	if err := p.Validate(); err != nil {
		return "", "", err
	}
	t, err := template.New("overrides.libvirt.template").Option("missingkey=error").Parse(text)
	if err != nil {
		return "", "", fmt.Errorf("parsing domain template: %w", err)
	}
	var b strings.Builder
	if err := t.Execute(&b, templateData(p)); err != nil {
		return "", "", fmt.Errorf("rendering domain template: %w", err)
	}
	var d libvirtxml.Domain
	if err := d.Unmarshal(b.String()); err != nil {
		return "", "", fmt.Errorf("checking rendered domain template: it is not a libvirt domain document: %w", err)
	}
	if err := checkTemplateDomain(&d, p); err != nil {
		return "", "", fmt.Errorf("checking rendered domain template: %w", err)
	}
	out, err := d.Marshal()
	if err != nil {
		return "", "", fmt.Errorf("encoding rendered domain template: %w", err)
	}
	return out, TemplateWarning, nil
}

// checkTemplateDomain refuses a domain that could run the guest outside
// its packet filter or hand it a channel the filter does not see: a NIC
// that is not on the instance network with the instance filter, devices
// passed through from the host (<hostdev>, USB redirection, smartcards,
// host input devices, the host TPM), shared host directories, shared
// memory and vsock, character devices backed by sockets, pipes or host
// devices (a <channel type='unix'> to /run/docker.sock, a serial port on
// a TCP connection), disks read or written over the network, audio
// streamed to a sound server, remote graphics, and the QEMU passthrough
// elements (command line, capabilities, device property overrides) that
// could add or rewire any of these behind libvirt's back. It also refuses
// turning QEMU's own confinement off.
func checkTemplateDomain(d *libvirtxml.Domain, p Params) error {
	if want := DomainName(p.Name); d.Name != want {
		return fmt.Errorf("domain name is %q, want %q (use {{.DomainName}})", d.Name, want)
	}
	if d.QEMUCommandline != nil {
		return fmt.Errorf("<qemu:commandline> is not allowed: it can attach devices outside the packet filter")
	}
	if d.QEMUCapabilities != nil || d.QEMUOverride != nil {
		return fmt.Errorf("<qemu:capabilities> and <qemu:override> are not allowed: they change QEMU devices behind libvirt's back")
	}
	if d.LXCNamespace != nil || d.BHyveCommandline != nil || d.XenCommandline != nil || d.VMWareDataCenterPath != nil {
		return fmt.Errorf("hypervisor-specific passthrough elements are not allowed")
	}
	for _, sl := range d.SecLabel {
		if sl.Type == "none" {
			return fmt.Errorf("<seclabel type='none'> is not allowed: it runs QEMU unconfined")
		}
		if sl.Model == "dac" && runsAsRoot(sl.Label) {
			return fmt.Errorf("<seclabel model='dac'> with label %q is not allowed: it runs QEMU as root", sl.Label)
		}
	}
	dev := d.Devices
	if dev == nil || len(dev.Interfaces) == 0 {
		return fmt.Errorf("no <interface>: the guest needs one on network %q with <filterref filter='{{.FilterName}}'/>", NetworkName(p.Name))
	}
	for i, nic := range dev.Interfaces {
		if nic.Source == nil || nic.Source.Network == nil || nic.Source.Network.Network != NetworkName(p.Name) {
			return fmt.Errorf("interface %d is not on network %q (use <source network='{{.NetworkName}}'/>)", i, NetworkName(p.Name))
		}
		if nic.FilterRef == nil || nic.FilterRef.Filter != FilterName(p.Name) {
			return fmt.Errorf("interface %d does not reference the packet filter (add <filterref filter='{{.FilterName}}'/>)", i)
		}
	}
	refused := []struct {
		n    int
		what string
	}{
		{len(dev.Hostdevs), "<hostdev> (a passed-through device, such as a host NIC, bypasses the packet filter)"},
		{len(dev.RedirDevs), "<redirdev> (USB redirection from the host or a network client)"},
		{len(dev.Smartcards), "<smartcard> (a host or remote card reader)"},
		{len(dev.Filesystems), "<filesystem> (a host directory shared with the guest)"},
		{len(dev.Shmems), "<shmem> (memory shared with the host or other guests)"},
		{boolInt(dev.VSock != nil), "<vsock> (a socket channel to the host)"},
	}
	for _, r := range refused {
		if r.n > 0 {
			return fmt.Errorf("%s is not allowed", r.what)
		}
	}
	for i, disk := range dev.Disks {
		if err := checkDiskSource(disk.Source, disk.BackingStore); err != nil {
			return fmt.Errorf("disk %d: %w", i, err)
		}
	}
	type chardev struct {
		what string
		src  *libvirtxml.DomainChardevSource
	}
	var chardevs []chardev
	for _, c := range dev.Serials {
		chardevs = append(chardevs, chardev{"<serial>", c.Source})
	}
	for _, c := range dev.Parallels {
		chardevs = append(chardevs, chardev{"<parallel>", c.Source})
	}
	for _, c := range dev.Consoles {
		chardevs = append(chardevs, chardev{"<console>", c.Source})
	}
	for _, c := range dev.Channels {
		if c.Target != nil && c.Target.GuestFWD != nil {
			return fmt.Errorf("<channel> with a guestfwd target is not allowed: it forwards guest connections to the host")
		}
		chardevs = append(chardevs, chardev{"<channel>", c.Source})
	}
	for _, c := range chardevs {
		if err := checkChardev(c.src); err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
	}
	for _, in := range dev.Inputs {
		if in.Type == "passthrough" || in.Type == "evdev" || in.Source != nil {
			return fmt.Errorf("<input type=%q> is not allowed: it hands a host input device to the guest", in.Type)
		}
	}
	for _, tpm := range dev.TPMs {
		if tpm.Backend != nil && (tpm.Backend.Passthrough != nil || tpm.Backend.External != nil) {
			return fmt.Errorf("<tpm> with a passthrough or external backend is not allowed: only the emulated TPM is")
		}
	}
	for _, rng := range dev.RNGs {
		if rng.Backend != nil && rng.Backend.EGD != nil {
			return fmt.Errorf("<rng> with an egd backend is not allowed: it talks to an entropy daemon over a socket")
		}
	}
	for _, a := range dev.Audios {
		if a.None == nil && a.SPICE == nil && a.SDL == nil {
			return fmt.Errorf("<audio id='%d'> is not allowed: only types none, spice and sdl are (a sound server or file would carry what the guest plays)", a.ID)
		}
	}
	for i, g := range dev.Graphics {
		if err := checkGraphics(g); err != nil {
			return fmt.Errorf("graphics %d: %w", i, err)
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runsAsRoot reports whether a DAC label ("user:group", "+uid:+gid")
// names root as the user.
func runsAsRoot(label string) bool {
	user, _, _ := strings.Cut(strings.TrimSpace(label), ":")
	return user == "root" || strings.TrimLeft(user, "+0") == "" && user != ""
}

// checkChardev allows a character device to end only in a file, a pty, a
// virtual console or nothing: never a socket, pipe, host device or a
// SPICE/D-Bus/clipboard endpoint, each a channel around the packet filter
// (a UNIX socket can even be a host daemon's control socket).
func checkChardev(src *libvirtxml.DomainChardevSource) error {
	if src == nil || src.File != nil || src.Pty != nil || src.Null != nil || src.VC != nil {
		return nil
	}
	return fmt.Errorf("only types file, pty, vc and null are allowed: any other backend (tcp, udp, unix, pipe, dev, spicevmc, ...) is a channel around the packet filter")
}

// checkDiskSource refuses disks (and their backing chains) that QEMU
// reads or writes over the network or through an external process.
func checkDiskSource(src *libvirtxml.DomainDiskSource, backing *libvirtxml.DomainDiskBackingStore) error {
	for depth := 0; ; depth++ {
		if depth > 64 {
			return fmt.Errorf("backing chain too deep")
		}
		if src != nil {
			if src.Network != nil || src.NVME != nil || src.VHostUser != nil || src.VHostVDPA != nil || src.Volume != nil {
				return fmt.Errorf("only file, block and dir sources are allowed: a network, storage-pool, NVMe or vhost disk can move data around the packet filter")
			}
			if src.DataStore != nil {
				if err := checkDiskSource(src.DataStore.Source, nil); err != nil {
					return err
				}
			}
		}
		if backing == nil {
			return nil
		}
		src, backing = backing.Source, backing.BackingStore
	}
}

// checkGraphics allows local displays, and VNC or SPICE only on a UNIX
// socket or a loopback address (given explicitly: libvirt's default comes
// from qemu.conf). A display reachable from the network is a way in and a
// way out that the packet filter does not see; D-Bus and RDP displays are
// refused.
func checkGraphics(g libvirtxml.DomainGraphic) error {
	var listen string
	var listeners []libvirtxml.DomainGraphicListener
	switch {
	case g.SDL != nil, g.Desktop != nil, g.EGLHeadless != nil:
		return nil
	case g.VNC != nil:
		if g.VNC.Socket != "" {
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
		case l.Socket != nil:
		case l.Address != nil && isLoopback(l.Address.Address):
		default:
			local = false
		}
	}
	if !local {
		return fmt.Errorf("vnc and spice must listen on a socket or an explicit loopback address (<listen type='address' address='127.0.0.1'/>)")
	}
	return nil
}

func isLoopback(addr string) bool {
	ip, err := netip.ParseAddr(addr)
	return err == nil && ip.IsLoopback()
}
