package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/validate"
)

// abox snapshots are qcow2 internal snapshots: libvirt keeps them inside
// the instance's overlay (taken with QEMU's savevm for a running guest,
// RAM and device state included, or qemu-img snapshot for a stopped one),
// so a snapshot never touches the shared base image below the overlay and
// goes away with the overlay. External snapshots would add files beside
// the overlay, and libvirt 9.0 cannot revert to them.

// ErrSnapshotExists is returned (wrapped) when a snapshot of that name exists.
var ErrSnapshotExists = errors.New("snapshot exists")

// MaxSnapshotDescription is the longest description accepted, in bytes.
const MaxSnapshotDescription = 1024

// Snapshot is one snapshot of a domain as libvirt describes it.
type Snapshot struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Created is when it was taken, to the second (libvirt's precision).
	Created time.Time `json:"created"`
	// State is the domain's state when it was taken; a snapshot of an
	// active domain (running, paused) holds its memory too.
	State DomainState `json:"state"`
	// Parent is the snapshot this one was taken on top of; empty for a root.
	Parent string `json:"parent,omitempty"`
	// Current is the snapshot the domain was last taken at or reverted to.
	Current bool `json:"current"`
}

// Memory reports whether reverting to s restores a running guest.
func (s Snapshot) Memory() bool { return s.State.Active() }

// SnapshotDescription checks a snapshot's description: printable UTF-8
// on one line, at most MaxSnapshotDescription bytes. libvirtxml escapes
// it; the check keeps list's table one line per snapshot.
func SnapshotDescription(d string) error {
	switch {
	case !utf8.ValidString(d):
		return errors.New("validating snapshot description: it is not valid UTF-8")
	case len(d) > MaxSnapshotDescription:
		return fmt.Errorf("validating snapshot description: it is %d bytes long, the limit is %d", len(d), MaxSnapshotDescription)
	}
	if i := strings.IndexFunc(d, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(d[i:])
		return fmt.Errorf("validating snapshot description: it contains %q; give one line of printable text", r)
	}
	return nil
}

// SnapshotXML is the snapshot document for dom (its definition as libvirt
// reports it now): RAM and device state when active, and every writable
// disk as an internal snapshot. Read-only disks (the cloud-init seed) are
// left out; a writable disk that is not a qcow2 file is refused, since its
// contents would silently not be part of the snapshot.
func SnapshotXML(name, description string, active bool, dom *libvirtxml.Domain) (string, error) {
	if err := validate.SnapshotName(name); err != nil {
		return "", err
	}
	if err := SnapshotDescription(description); err != nil {
		return "", err
	}
	s := libvirtxml.DomainSnapshot{
		Name:        name,
		Description: description,
		Memory:      &libvirtxml.DomainSnapshotMemory{Snapshot: "no"},
		Disks:       &libvirtxml.DomainSnapshotDisks{},
	}
	if active {
		s.Memory.Snapshot = "internal"
	}
	internal := 0
	if dom.Devices != nil {
		for _, d := range dom.Devices.Disks {
			if d.Target == nil || d.Target.Dev == "" {
				return "", fmt.Errorf("snapshot %s of %s: a disk has no target device", name, dom.Name)
			}
			dev := d.Target.Dev
			if d.ReadOnly != nil || d.Device == "cdrom" || d.Device == "floppy" {
				s.Disks.Disks = append(s.Disks.Disks, libvirtxml.DomainSnapshotDisk{Name: dev, Snapshot: "no"})
				continue
			}
			if d.Source == nil || d.Source.File == nil || d.Driver == nil || d.Driver.Type != "qcow2" {
				format := "of unknown format"
				if d.Driver != nil && d.Driver.Type != "" {
					format = d.Driver.Type
				}
				return "", fmt.Errorf("snapshot %s of %s: disk %s is a writable disk that is not a qcow2 file (%s): abox snapshots are qcow2 internal snapshots, and its contents would not be in the snapshot (give the domain template a qcow2 disk)", name, dom.Name, dev, format)
			}
			s.Disks.Disks = append(s.Disks.Disks, libvirtxml.DomainSnapshotDisk{Name: dev, Snapshot: "internal"})
			internal++
		}
	}
	if internal == 0 {
		return "", fmt.Errorf("snapshot %s of %s: the domain has no writable qcow2 disk to snapshot", name, dom.Name)
	}
	doc, err := s.Marshal()
	if err != nil {
		return "", fmt.Errorf("snapshot %s of %s: encoding: %w", name, dom.Name, err)
	}
	return doc, nil
}

// parseSnapshot reads libvirt's description of a snapshot.
func parseSnapshot(doc string) (Snapshot, error) {
	var x libvirtxml.DomainSnapshot
	if err := x.Unmarshal(doc); err != nil {
		return Snapshot{}, fmt.Errorf("parsing snapshot XML: %w", err)
	}
	s := Snapshot{Name: x.Name, Description: x.Description, State: DomainState(x.State)}
	if x.State == "disk-snapshot" {
		s.State = StateShutoff // libvirt's name for a disk-only snapshot
	}
	if x.Parent != nil {
		s.Parent = x.Parent.Name
	}
	if x.CreationTime != "" {
		sec, err := strconv.ParseInt(x.CreationTime, 10, 64)
		if err != nil {
			return Snapshot{}, fmt.Errorf("parsing snapshot %s: creation time %q: %w", x.Name, x.CreationTime, err)
		}
		s.Created = time.Unix(sec, 0).UTC()
	}
	return s, nil
}

// CheckNetwork checks that a domain definition (the live one after a
// revert, which libvirt may have taken from the snapshot) still has
// exactly the instance's NIC: on its network, with its MAC and its packet
// filter. A snapshot holds the guest only; this and CheckDevices keep an
// old definition from bringing back anything else.
func CheckNetwork(d *libvirtxml.Domain, p Params) error {
	if d.Devices == nil || len(d.Devices.Interfaces) != 1 {
		n := 0
		if d.Devices != nil {
			n = len(d.Devices.Interfaces)
		}
		return fmt.Errorf("domain %s has %d network interfaces, want exactly the instance's one", d.Name, n)
	}
	nic := d.Devices.Interfaces[0]
	if nic.MAC == nil || !strings.EqualFold(nic.MAC.Address, p.MAC) {
		return fmt.Errorf("domain %s: its network interface does not have the instance's MAC %s", d.Name, p.MAC)
	}
	if nic.Source == nil || nic.Source.Network == nil || nic.Source.Network.Network != NetworkName(p.Name) {
		return fmt.Errorf("domain %s: its network interface is not on network %s", d.Name, NetworkName(p.Name))
	}
	if nic.FilterRef == nil || nic.FilterRef.Filter != FilterName(p.Name) || len(nic.FilterRef.Parameters) > 0 {
		return fmt.Errorf("domain %s: its network interface does not carry the packet filter %s", d.Name, FilterName(p.Name))
	}
	return nil
}

// snapshotDefinitions returns the domain definitions a snapshot document
// keeps, as libvirt wrote them: <domain> (the one a revert runs) and
// <inactiveDomain> (the persistent one it restores), the latter renamed
// <domain>. A namespace the snapshot document declares around them is
// not carried over: its elements then fail the allow list.
func snapshotDefinitions(doc string) ([]string, error) {
	dec := xml.NewDecoder(strings.NewReader(doc))
	var defs []string
	depth := 0
	for {
		off := dec.InputOffset()
		tok, err := dec.Token()
		if err == io.EOF {
			return defs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("parsing snapshot XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 1 && t.Name.Space == "" && (t.Name.Local == "domain" || t.Name.Local == "inactiveDomain") {
				if err := dec.Skip(); err != nil {
					return nil, fmt.Errorf("parsing snapshot XML: %w", err)
				}
				def := doc[off:dec.InputOffset()]
				if t.Name.Local == "inactiveDomain" {
					def = "<domain" + strings.TrimPrefix(def, "<inactiveDomain")
					if s, ok := strings.CutSuffix(def, "</inactiveDomain>"); ok {
						def = s + "</domain>"
					}
				}
				defs = append(defs, def)
				continue
			}
			depth++
		case xml.EndElement:
			depth--
		}
	}
}
