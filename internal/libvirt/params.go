// Package libvirt builds abox's libvirt documents (network, nwfilter, domain) structurally and drives libvirtd over its RPC socket.
package libvirt

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"

	"github.com/abox-dev/abox/internal/validate"
)

// Accel selects the hypervisor accelerator. "auto" is resolved by the
// caller (it needs a boot probe, see LAB.md); the builders accept only a
// decided value.
type Accel string

const (
	AccelKVM Accel = "kvm"
	AccelTCG Accel = "tcg"
)

// ObjectPrefix starts the name of every libvirt object abox defines, so
// abox never touches objects it did not create (such as libvirt's own
// "default" network) and a user can tell them apart in virsh.
const ObjectPrefix = "abox-"

// DomainName, NetworkName and FilterName name an instance's libvirt
// objects. They are one prefix on a validated instance name, so they are
// safe anywhere libvirt accepts a name.
func DomainName(instance string) string  { return ObjectPrefix + instance }
func NetworkName(instance string) string { return ObjectPrefix + instance }
func FilterName(instance string) string  { return ObjectPrefix + instance }

// Params is everything the builders need to describe one instance. All
// fields are required unless marked optional; Validate enforces that.
type Params struct {
	Name string // instance name; validate.InstanceName must accept it
	UUID string // domain UUID, lowercase 8-4-4-4-12 hex; fixed at creation

	Bridge  string       // host bridge; at most 15 characters (validate.Bridge)
	Subnet  netip.Prefix // the instance's IPv4 /24
	Gateway netip.Addr   // host address on the bridge, inside Subnet (conventionally .1)
	GuestIP netip.Addr   // the guest's static address, inside Subnet (conventionally .10)
	MAC     string       // guest NIC MAC; validate.GuestMAC must accept it

	ProxyPort uint16 // TCP port of the HTTP proxy on Gateway; non-zero
	// CaptureHTTPPort and CaptureTLSPort are the proxy's capture ports on
	// Gateway, where the host DNATs the guest's TCP to port 80 and 443 of
	// other addresses (hostfw); the packet filter admits them as gateway
	// services. Both 0 (no capture) or both set, distinct from each other
	// and from ProxyPort and 53.
	CaptureHTTPPort, CaptureTLSPort uint16

	CPUs      uint // virtual CPUs, 1..64
	MemoryMiB uint // guest RAM in MiB, 128..1048576

	DiskPath      string // absolute path of the instance's qcow2 overlay
	SeedISOPath   string // absolute path of the cloud-init NoCloud ISO
	SerialLogPath string // absolute path the serial console is written to
	// BackingPath is the base image's disk the overlay was created on: the
	// only backing file a definition libvirt reports may name (after a
	// revert), and the only one export follows. Empty: none.
	BackingPath string

	// InstanceDir is the instance's directory (absolute). Optional for
	// the builders; a user template's sockets must lie in its run/
	// subdirectory, and the libvirt hook finds the instance by it.
	InstanceDir string

	// MonitorSocket, optional, is the host end of the runtime monitor's
	// virtio-serial channel (MonitorChannel): a unix socket libvirt binds,
	// in the instance's run/ directory, which only root may enter.
	MonitorSocket string

	// Optional direct kernel boot: Kernel set means boot it instead of
	// the disk's boot loader; Initrd and Cmdline are then optional too.
	Kernel  string
	Initrd  string
	Cmdline string

	Accel Accel // AccelKVM or AccelTCG
}

var uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// Validate checks every field, so that nothing malformed reaches libvirt
// and a bad value is reported by name rather than as a libvirt XML error.
func (p Params) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if err := validate.InstanceName(p.Name); err != nil {
		errs = append(errs, err)
	}
	if !uuidPattern.MatchString(p.UUID) {
		add("uuid %q: want lowercase 8-4-4-4-12 hex", p.UUID)
	}
	if err := validate.Bridge(p.Bridge); err != nil {
		errs = append(errs, err)
	}
	if err := validate.GuestMAC(p.MAC); err != nil {
		errs = append(errs, err)
	}
	switch {
	case !p.Subnet.IsValid() || !p.Subnet.Addr().Is4():
		add("subnet %v: want an IPv4 prefix", p.Subnet)
	case p.Subnet.Bits() != 24:
		add("subnet %v: want a /24", p.Subnet)
	case p.Subnet != p.Subnet.Masked():
		add("subnet %v: host bits set; want %v", p.Subnet, p.Subnet.Masked())
	default:
		for _, a := range []struct {
			what string
			ip   netip.Addr
		}{{"gateway", p.Gateway}, {"guest ip", p.GuestIP}} {
			if !a.ip.Is4() || !p.Subnet.Contains(a.ip) || a.ip == p.Subnet.Addr() || a.ip.As4()[3] == 255 {
				add("%s %v: want a host address inside %v", a.what, a.ip, p.Subnet)
			}
		}
		if p.Gateway == p.GuestIP {
			add("guest ip %v: must differ from the gateway", p.GuestIP)
		}
	}
	if p.ProxyPort == 0 {
		add("proxy port: must be set")
	}
	if (p.CaptureHTTPPort == 0) != (p.CaptureTLSPort == 0) {
		add("capture ports %d and %d: set both or neither", p.CaptureHTTPPort, p.CaptureTLSPort)
	} else if p.CaptureHTTPPort != 0 {
		taken := map[uint16]bool{53: true, p.ProxyPort: true}
		for _, c := range []uint16{p.CaptureHTTPPort, p.CaptureTLSPort} {
			if taken[c] {
				add("capture port %d: taken by DNS, the proxy or the other capture port; give each its own", c)
			}
			taken[c] = true
		}
	}
	if p.CPUs < 1 || p.CPUs > 64 {
		add("cpus %d: want 1 to 64", p.CPUs)
	}
	if p.MemoryMiB < 128 || p.MemoryMiB > 1<<20 {
		add("memory %d MiB: want 128 to 1048576", p.MemoryMiB)
	}
	for _, f := range []struct {
		what, path string
		optional   bool
	}{
		{"disk path", p.DiskPath, false},
		{"seed iso path", p.SeedISOPath, false},
		{"serial log path", p.SerialLogPath, false},
		{"kernel path", p.Kernel, true},
		{"initrd path", p.Initrd, true},
		{"backing path", p.BackingPath, true},
		{"instance dir", p.InstanceDir, true},
		{"monitor socket", p.MonitorSocket, true},
	} {
		if f.path == "" && f.optional {
			continue
		}
		// Relative paths would be resolved by libvirtd in its own working
		// directory, not ours.
		if !filepath.IsAbs(f.path) {
			add("%s %q: want an absolute path", f.what, f.path)
		}
	}
	if p.Kernel == "" && (p.Initrd != "" || p.Cmdline != "") {
		add("initrd and cmdline need a kernel path")
	}
	if p.Accel != AccelKVM && p.Accel != AccelTCG {
		add("accel %q: want %q or %q", p.Accel, AccelKVM, AccelTCG)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checking libvirt parameters for %q: %w", p.Name, err)
	}
	return nil
}

// derivedUUID gives a network or nwfilter a UUID that is stable for one
// instance creation. libvirt refuses to redefine an object whose name
// matches but whose UUID differs, and generates a random UUID when none is
// given, so a stable one is what makes redefinition (an update) work.
func derivedUUID(kind, instanceUUID string) string {
	s := sha256.Sum256([]byte("abox/" + kind + "/" + instanceUUID))
	s[6] = s[6]&0x0f | 0x50 // version 5-style (name based)
	s[8] = s[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}
