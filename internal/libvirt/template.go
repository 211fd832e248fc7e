package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/limitio"
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

// MaxRenderedBytes bounds a rendered domain template: abox's own domain is
// a few KiB, and a template must not make abox hold gigabytes.
const MaxRenderedBytes = 1 << 20

// boundedTemplate refuses the actions that make a template's work grow
// faster than its text: {{range}} (a number ranges since Go 1.22, and
// nested ranges never end; TemplateData holds no lists to range over) and
// {{template}}, {{define}} and {{block}} (templates calling each other
// twenty times a level render megabytes from a few lines, or spin without
// output). Field values, {{if}} and {{with}} are what a domain needs, and
// do as much work as the text is long.
func boundedTemplate(t *template.Template) error {
	if len(t.Templates()) > 1 {
		return errors.New("{{define}} and {{block}} are not allowed in a domain template; write the domain out")
	}
	var walk func(n parse.Node) error
	walk = func(n parse.Node) error {
		switch n := n.(type) {
		case *parse.ListNode:
			if n == nil {
				return nil
			}
			for _, c := range n.Nodes {
				if err := walk(c); err != nil {
					return err
				}
			}
		case *parse.IfNode:
			return errors.Join(walk(n.List), walk(n.ElseList))
		case *parse.WithNode:
			return errors.Join(walk(n.List), walk(n.ElseList))
		case *parse.RangeNode:
			return fmt.Errorf("line %d: {{range}} is not allowed in a domain template (its values are single strings; write repeated elements out)", n.Line)
		case *parse.TemplateNode:
			return fmt.Errorf("line %d: {{template}} is not allowed in a domain template; write the domain out", n.Line)
		}
		return nil
	}
	if t.Tree == nil {
		return nil
	}
	return walk(t.Tree.Root)
}

// RenderTemplate renders a user domain template (overrides.libvirt.template,
// Go text/template syntax over TemplateData) and checks the result. It
// returns the domain XML and TemplateWarning, which the caller must show
// the user. The result is refused unless it parses as a libvirt domain
// named DomainName(p.Name) with at least one NIC, every NIC on the
// instance network and carrying the instance nwfilter, and nothing but
// what the allow list in template_check.go accepts, element by element and
// attribute by attribute: host paths only the instance's own files,
// sockets only in its run directory at names abox does not use, the
// host's QEMU.
//
// The check walks the rendered text itself, so an element libvirtxml does
// not know (a device type newer than it, a misspelling libvirt happens to
// accept) is refused by name rather than passed unseen. The XML returned
// is the checked document as libvirtxml re-encodes it (with abox's
// metadata, the disks' formats and the monitor channel added), never the
// rendered text.
func RenderTemplate(text string, p Params) (domainXML, warning string, err error) {
	if err := p.Validate(); err != nil {
		return "", "", err
	}
	t, err := template.New("overrides.libvirt.template").Option("missingkey=error").Parse(text)
	if err != nil {
		return "", "", fmt.Errorf("parsing domain template: %w", err)
	}
	if err := boundedTemplate(t); err != nil {
		return "", "", fmt.Errorf("parsing domain template: %w", err)
	}
	b := &limitio.Buffer{Max: MaxRenderedBytes, Fail: true}
	if err := t.Execute(b, templateData(p)); err != nil {
		if b.Over() {
			return "", "", fmt.Errorf("rendering domain template: the domain would be larger than %d bytes", MaxRenderedBytes)
		}
		return "", "", fmt.Errorf("rendering domain template: %w", err)
	}
	d, err := checkTemplate(string(b.Bytes()), p)
	if err != nil {
		return "", "", fmt.Errorf("checking rendered domain template: %w", err)
	}
	// The monitor's channel is abox's, added here as in the hardened
	// domain; a template may not bring its own under that name.
	for _, c := range d.Devices.Channels {
		if c.Target != nil && c.Target.VirtIO != nil && c.Target.VirtIO.Name == MonitorChannel {
			return "", "", fmt.Errorf("checking rendered domain template: <channel> %s is abox's monitor channel; leave it out (create --monitor adds it)", MonitorChannel)
		}
	}
	if p.MonitorSocket != "" {
		d.Devices.Channels = append(d.Devices.Channels, MonitorChannelDevice(p.MonitorSocket))
	}
	// The metadata says whose domain this is (the libvirt hook reads it
	// to find the instance): always abox's own, never the template's.
	meta, err := metadataXML(p)
	if err != nil {
		return "", "", fmt.Errorf("building domain for %q: %w", p.Name, err)
	}
	d.Metadata = &libvirtxml.DomainMetadata{XML: meta}
	out, err := d.Marshal()
	if err != nil {
		return "", "", fmt.Errorf("encoding rendered domain template: %w", err)
	}
	return out, TemplateWarning, nil
}
