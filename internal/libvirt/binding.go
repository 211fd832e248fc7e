package libvirt

import (
	"context"
	"fmt"

	golibvirt "github.com/digitalocean/go-libvirt"
)

// binder is the part of go-libvirt that recreates an nwfilter binding;
// kept apart from remote, like inspector, so the lifecycle fakes need not
// grow.
type binder interface {
	NwfilterBindingLookupByPortDev(name string) (golibvirt.NwfilterBinding, error)
	NwfilterBindingGetXMLDesc(b golibvirt.NwfilterBinding, flags uint32) (string, error)
	NwfilterBindingDelete(b golibvirt.NwfilterBinding) error
	NwfilterBindingCreateXML(xml string, flags uint32) (golibvirt.NwfilterBinding, error)
}

// RebindNWFilter has libvirt build the kernel rules of the nwfilter
// binding on portdev again, by deleting the binding and creating it from
// its own definition: libvirt notices nothing when a flush of ebtables or
// iptables empties them (see hostfw.CheckNWFilter), and rebuilds them
// only then (or when libvirtd reloads every binding). The binding keeps
// its filter and parameters exactly; while it is gone the flushed rules
// were gone already.
func (c *Client) RebindNWFilter(ctx context.Context, portdev string) error {
	b, ok := c.r.(binder)
	if !ok {
		return errNoInspect
	}
	cur, err := call(ctx, func() (golibvirt.NwfilterBinding, error) { return b.NwfilterBindingLookupByPortDev(portdev) })
	if err != nil {
		return fmt.Errorf("looking up the nwfilter binding of %s: %w", portdev, notFound(err))
	}
	doc, err := call(ctx, func() (string, error) { return b.NwfilterBindingGetXMLDesc(cur, 0) })
	if err != nil {
		return fmt.Errorf("reading the nwfilter binding of %s: %w", portdev, err)
	}
	if _, err := call(ctx, func() (struct{}, error) { return struct{}{}, b.NwfilterBindingDelete(cur) }); err != nil {
		return fmt.Errorf("deleting the nwfilter binding of %s: %w", portdev, err)
	}
	if _, err := call(ctx, func() (golibvirt.NwfilterBinding, error) { return b.NwfilterBindingCreateXML(doc, 0) }); err != nil {
		return fmt.Errorf("creating the nwfilter binding of %s again (its definition: %s): %w", portdev, doc, err)
	}
	return nil
}

var _ binder = (*golibvirt.Libvirt)(nil)
