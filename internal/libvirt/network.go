package libvirt

import (
	"encoding/xml"
	"fmt"

	"libvirt.org/go/libvirtxml"
)

// MetadataNamespace marks libvirt objects as abox's. libvirt keeps
// metadata per namespace URI, so ours never clashes with other tools'.
const MetadataNamespace = "https://github.com/abox-dev/abox/libvirt/v1"

// ownerMetadata is the element abox puts in <metadata>. It lets abox (and
// a human with virsh) tell its objects from foreign ones and find the
// instance an object belongs to.
type ownerMetadata struct {
	XMLName xml.Name `xml:"https://github.com/abox-dev/abox/libvirt/v1 instance"`
	Name    string   `xml:"name,attr"`
	UUID    string   `xml:"uuid,attr"`
	Managed string   `xml:"managed-by,attr"`
	Dir     string   `xml:"dir,attr,omitempty"` // the instance directory, absolute
	Warning string   `xml:"note"`
}

// metadataXML marshals the ownership element with encoding/xml, which
// escapes the values; it is the inner XML of a <metadata> element.
func metadataXML(p Params) (string, error) {
	b, err := xml.Marshal(ownerMetadata{
		Name:    p.Name,
		UUID:    p.UUID,
		Managed: "abox",
		Dir:     p.InstanceDir,
		Warning: "managed by abox; edits are overwritten on the next abox create or start",
	})
	if err != nil {
		return "", fmt.Errorf("encoding metadata: %w", err)
	}
	return string(b), nil
}

// BuildNetwork returns the instance's host-only network: a bridge with the
// gateway address and nothing else. There is no <forward> element, so
// libvirt adds no NAT or routing and the guest has no path off the bridge;
// <dns enable='no'/> stops libvirt from starting dnsmasq, which would take
// port 53 on the gateway from abox's DNS filter; there is no <dhcp>, since
// the guest is addressed statically by cloud-init. Without an IPv6 address
// libvirt also disables IPv6 on the bridge.
func BuildNetwork(p Params) (*libvirtxml.Network, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	meta, err := metadataXML(p)
	if err != nil {
		return nil, fmt.Errorf("building network for %q: %w", p.Name, err)
	}
	return &libvirtxml.Network{
		Name:     NetworkName(p.Name),
		UUID:     derivedUUID("network", p.UUID),
		Metadata: &libvirtxml.NetworkMetadata{XML: meta},
		// STP off: a one-port bridge cannot loop, and with the kernel's
		// STP on the bridge hands every BPDU from the guest to its STP
		// code before ebtables sees the frame, so the nwfilter's layer-2
		// drop cannot stop a guest from claiming root, sending topology
		// changes or feeding the host's STP parser. With STP off a BPDU
		// is an ordinary frame and the nwfilter drops it. Delay 0: no
		// forwarding delay for the guest's first packets.
		Bridge: &libvirtxml.NetworkBridge{Name: p.Bridge, STP: "off", Delay: "0"},
		DNS:    &libvirtxml.NetworkDNS{Enable: "no"},
		IPs: []libvirtxml.NetworkIP{{
			Address: p.Gateway.String(),
			Prefix:  uint(p.Subnet.Bits()),
		}},
	}, nil
}

// NetworkXML is BuildNetwork marshalled to libvirt's XML.
func NetworkXML(p Params) (string, error) {
	n, err := BuildNetwork(p)
	if err != nil {
		return "", err
	}
	s, err := n.Marshal()
	if err != nil {
		return "", fmt.Errorf("encoding network for %q: %w", p.Name, err)
	}
	return s, nil
}
