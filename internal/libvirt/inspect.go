package libvirt

import (
	"context"
	"errors"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// inspector is the read-only part of go-libvirt that abox doctor uses; it is
// kept apart from remote so that the lifecycle fakes need not grow.
type inspector interface {
	DomainGetXMLDesc(d golibvirt.Domain, flags golibvirt.DomainXMLFlags) (string, error)
	NwfilterGetXMLDesc(f golibvirt.Nwfilter, flags uint32) (string, error)
	ConnectListAllNwfilterBindings(need int32, flags uint32) ([]golibvirt.NwfilterBinding, uint32, error)
}

var errNoInspect = errors.New("this libvirt connection cannot inspect definitions")

func (c *Client) inspector() (inspector, error) {
	i, ok := c.r.(inspector)
	if !ok {
		return nil, errNoInspect
	}
	return i, nil
}

// NIC is one network interface of a domain definition.
type NIC struct {
	// Target is the host-side device (vnetN) of a running domain; empty in
	// the persistent definition.
	Target string
	MAC    string
	// Network is the libvirt network the interface is attached to.
	Network string
	// FilterRef is the nwfilter the interface references; empty for none.
	FilterRef string
}

// DomainNICs returns the interfaces of a domain: of its running instance
// (live) or of its persistent definition.
func (c *Client) DomainNICs(ctx context.Context, name string, live bool) ([]NIC, error) {
	in, err := c.inspector()
	if err != nil {
		return nil, err
	}
	d, _, err := c.domain(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("reading domain %s: %w", name, err)
	}
	var flags golibvirt.DomainXMLFlags
	if !live {
		flags = golibvirt.DomainXMLInactive
	}
	doc, err := call(ctx, func() (string, error) { return in.DomainGetXMLDesc(d, flags) })
	if err != nil {
		return nil, fmt.Errorf("reading domain %s: %w", name, err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("parsing domain %s: %w", name, err)
	}
	var out []NIC
	if dom.Devices == nil {
		return nil, nil
	}
	for _, i := range dom.Devices.Interfaces {
		n := NIC{}
		if i.Target != nil {
			n.Target = i.Target.Dev
		}
		if i.MAC != nil {
			n.MAC = i.MAC.Address
		}
		if i.Source != nil && i.Source.Network != nil {
			n.Network = i.Source.Network.Network
		}
		if i.FilterRef != nil {
			n.FilterRef = i.FilterRef.Filter
		}
		out = append(out, n)
	}
	return out, nil
}

// NWFilterBindings returns the nwfilter bound to each host port device
// (vnetN → filter name): what libvirt actually applies to a running guest's
// traffic, whatever the domain definition says.
func (c *Client) NWFilterBindings(ctx context.Context) (map[string]string, error) {
	in, err := c.inspector()
	if err != nil {
		return nil, err
	}
	bs, err := call(ctx, func() ([]golibvirt.NwfilterBinding, error) {
		b, _, err := in.ConnectListAllNwfilterBindings(1, 0)
		return b, err
	})
	if err != nil {
		return nil, fmt.Errorf("listing nwfilter bindings: %w", err)
	}
	out := make(map[string]string, len(bs))
	for _, b := range bs {
		out[b.Portdev] = b.Filtername
	}
	return out, nil
}

// NWFilter returns the defined nwfilter called name.
func (c *Client) NWFilter(ctx context.Context, name string) (*libvirtxml.NWFilter, error) {
	in, err := c.inspector()
	if err != nil {
		return nil, err
	}
	f, err := call(ctx, func() (golibvirt.Nwfilter, error) { return c.r.NwfilterLookupByName(name) })
	if err != nil {
		return nil, fmt.Errorf("reading nwfilter %s: %w", name, notFound(err))
	}
	doc, err := call(ctx, func() (string, error) { return in.NwfilterGetXMLDesc(f, 0) })
	if err != nil {
		return nil, fmt.Errorf("reading nwfilter %s: %w", name, err)
	}
	var nf libvirtxml.NWFilter
	if err := nf.Unmarshal(doc); err != nil {
		return nil, fmt.Errorf("parsing nwfilter %s: %w", name, err)
	}
	return &nf, nil
}
