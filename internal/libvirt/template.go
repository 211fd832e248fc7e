package libvirt

import (
	"encoding/xml"
	"fmt"
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
// instance network and carrying the instance nwfilter, and no
// <qemu:commandline> or <hostdev> (either could add an unfiltered NIC).
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
	out := b.String()
	if err := checkTemplateDomain(out, p); err != nil {
		return "", "", fmt.Errorf("checking rendered domain template: %w", err)
	}
	return out, TemplateWarning, nil
}

func checkTemplateDomain(doc string, p Params) error {
	var d libvirtxml.Domain
	if err := d.Unmarshal(doc); err != nil {
		return fmt.Errorf("it is not a libvirt domain document: %w", err)
	}
	if want := DomainName(p.Name); d.Name != want {
		return fmt.Errorf("domain name is %q, want %q (use {{.DomainName}})", d.Name, want)
	}
	if d.QEMUCommandline != nil {
		return fmt.Errorf("<qemu:commandline> is not allowed: it can attach devices outside the packet filter")
	}
	if d.Devices != nil && len(d.Devices.Hostdevs) > 0 {
		return fmt.Errorf("<hostdev> is not allowed: a passed-through device (such as a host NIC) bypasses the packet filter")
	}
	if d.Devices == nil || len(d.Devices.Interfaces) == 0 {
		return fmt.Errorf("no <interface>: the guest needs one on network %q with <filterref filter='{{.FilterName}}'/>", NetworkName(p.Name))
	}
	for i, nic := range d.Devices.Interfaces {
		if nic.Source == nil || nic.Source.Network == nil || nic.Source.Network.Network != NetworkName(p.Name) {
			return fmt.Errorf("interface %d is not on network %q (use <source network='{{.NetworkName}}'/>)", i, NetworkName(p.Name))
		}
		if nic.FilterRef == nil || nic.FilterRef.Filter != FilterName(p.Name) {
			return fmt.Errorf("interface %d does not reference the packet filter (add <filterref filter='{{.FilterName}}'/>)", i)
		}
	}
	return nil
}
