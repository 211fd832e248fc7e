// Package validate checks user-controlled identifiers (instance names, MACs) and derives safe host-side names from them.
package validate

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"unicode/utf8"
)

// The patterns are the ones in the security design; they are anchored so a
// value either matches whole or is refused, and they admit only ASCII, so
// a validated value is safe in libvirt names, file paths and iptables rules.
var (
	namePattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_-]{0,62}$`)
	macPattern  = regexp.MustCompile(`^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$`)
)

// MaxNameLen is the longest instance name accepted.
const MaxNameLen = 63

// InstanceName reports whether name is a valid instance name. The error
// names the problem and how to fix it; the offending value is quoted with
// %q so control characters or markup in it cannot confuse a terminal or log.
func InstanceName(name string) error {
	if namePattern.MatchString(name) {
		return nil
	}
	problem := lengthProblem(name)
	switch {
	case problem != "":
	case !isASCIILetter(name[0]):
		problem = "it must start with a letter (a-z, A-Z)"
	default:
		r, _ := utf8.DecodeRuneInString(name[strings.IndexFunc(name, isBadNameRune):])
		problem = fmt.Sprintf("it contains %q; only letters, digits, '_' and '-' are allowed", r)
	}
	return fmt.Errorf("validating instance name %q: %s (use something like \"dev\" or \"agent-1\", matching %s)",
		name, problem, namePattern.String())
}

// lengthProblem is what is wrong with a name before its characters are
// looked at: empty, not UTF-8, or too long; "" when nothing.
func lengthProblem(name string) string {
	switch {
	case name == "":
		return "it is empty"
	case !utf8.ValidString(name):
		return "it is not valid UTF-8"
	case len(name) > MaxNameLen:
		return fmt.Sprintf("it is %d bytes long, the limit is %d", len(name), MaxNameLen)
	}
	return ""
}

func isASCIILetter(b byte) bool { return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') }

func isBadNameRune(r rune) bool {
	switch {
	case r < utf8.RuneSelf && isASCIILetter(byte(r)):
		return false
	case r >= '0' && r <= '9', r == '_', r == '-':
		return false
	}
	return true
}

// MAC reports whether mac is a colon-separated 48-bit MAC address
// (aa:bb:cc:dd:ee:ff). Other notations net.ParseMAC accepts (dashes, dots,
// 64-bit EUI) are refused on purpose: libvirt, nwfilter and cloud-init all
// compare MACs textually, so one canonical form avoids silent mismatches.
func MAC(mac string) error {
	if macPattern.MatchString(mac) {
		return nil
	}
	return fmt.Errorf("validating MAC address %q: want six two-digit hex bytes separated by colons, such as 52:54:00:12:34:56", mac)
}

// GuestMAC validates mac like MAC and additionally requires a unicast,
// locally administered address: a multicast source MAC would be flooded by
// the bridge, and a globally administered one could collide with real
// hardware on the host.
func GuestMAC(mac string) error {
	if err := MAC(mac); err != nil {
		return err
	}
	hw, err := net.ParseMAC(mac)
	if err != nil {
		return fmt.Errorf("validating MAC address %q: %w", mac, err)
	}
	if hw[0]&0x01 != 0 {
		return fmt.Errorf("validating MAC address %q: it is a multicast address (lowest bit of the first byte set); use a unicast one such as 52:54:00:12:34:56", mac)
	}
	if hw[0]&0x02 == 0 && !strings.EqualFold(mac[:8], qemuOUI) {
		return fmt.Errorf("validating MAC address %q: it is globally administered; use a locally administered one (52:54:00:xx:xx:xx)", mac)
	}
	return nil
}

// qemuOUI is the prefix QEMU and libvirt use for guest NICs. It is
// technically globally administered, but it is reserved for QEMU guests, so
// GuestMAC accepts it as libvirt itself does.
const qemuOUI = "52:54:00"

// NewMAC returns a random guest MAC with QEMU's 52:54:00 prefix, reading
// three bytes from r (crypto/rand.Reader when r is nil). Callers that must
// avoid collisions with other instances check the result against the MACs
// already in use and draw again.
func NewMAC(r io.Reader) (string, error) {
	if r == nil {
		r = rand.Reader
	}
	var b [3]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return "", fmt.Errorf("generating MAC address: %w", err)
	}
	return fmt.Sprintf("%s:%02x:%02x:%02x", qemuOUI, b[0], b[1], b[2]), nil
}

// MaxBridgeLen is the kernel's limit for interface names (IFNAMSIZ-1).
const MaxBridgeLen = 15

// BridgePrefix starts every bridge abox creates, so its bridges are
// recognisable in `ip link` and never clash with libvirt's virbrN.
const BridgePrefix = "abx-"

// BridgeName derives the bridge for an instance from its name: "abx-" plus
// the first 11 hex digits of SHA-256(name). It is deterministic (the same
// instance always gets the same bridge, so a recreated network and the host
// firewall agree without stored state), fits IFNAMSIZ, and is made only of
// characters safe in iptables arguments whatever the name. 44 bits make an
// accidental collision between two instance names practically impossible;
// callers still check the result against existing links and libvirt networks.
func BridgeName(instance string) (string, error) {
	if err := InstanceName(instance); err != nil {
		return "", fmt.Errorf("deriving bridge name: %w", err)
	}
	sum := sha256.Sum256([]byte(instance))
	return BridgePrefix + hex.EncodeToString(sum[:])[:MaxBridgeLen-len(BridgePrefix)], nil
}

// Bridge reports whether br is a name abox may use for a bridge: it must
// fit IFNAMSIZ and consist of characters that are safe unquoted in iptables
// and ip(8) arguments.
func Bridge(br string) error {
	if len(br) == 0 || len(br) > MaxBridgeLen {
		return fmt.Errorf("validating bridge name %q: want 1 to %d characters, got %d", br, MaxBridgeLen, len(br))
	}
	if !bridgePattern.MatchString(br) {
		return fmt.Errorf("validating bridge name %q: want letters, digits, '-' or '_' only, starting with a letter", br)
	}
	return nil
}

var bridgePattern = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_-]*$`)

// MinForwardHostPort is the lowest host port a forward may listen on. The
// ports below it are where the host's own services live (ssh 22, DNS 53,
// SMTP 25, CUPS 631): a forward there would put the guest behind a name
// host programs trust, on 127.0.0.1 where another service may be expected.
const MinForwardHostPort = 1024

// ForwardHostPort checks the host port a host-to-guest forward listens on.
func ForwardHostPort(port uint16) error {
	if port < MinForwardHostPort {
		return fmt.Errorf("host port %d is a privileged port, where host services listen; forward from a port of %d or above (such as %d:%d)", port, MinForwardHostPort, 8000+int(port), port)
	}
	return nil
}

var snapshotPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`)

// SnapshotName reports whether name is a valid snapshot name: 1-63 ASCII
// letters, digits, '.', '_' and '-', starting with a letter or digit, so it
// is safe in libvirt's snapshot XML and in the file libvirt names after
// it. All digits is refused: QEMU looks an internal snapshot up by its
// numeric id as well as by its name, so "2" could mean another snapshot.
func SnapshotName(name string) error {
	problem := lengthProblem(name)
	switch {
	case snapshotPattern.MatchString(name) && strings.Trim(name, "0123456789") == "":
		problem = "it is all digits, which QEMU would take for a snapshot id"
	case snapshotPattern.MatchString(name):
		return nil
	case problem != "":
	case !isSnapshotRune(rune(name[0])) || name[0] == '.' || name[0] == '_' || name[0] == '-':
		problem = "it must start with a letter or a digit"
	default:
		r, _ := utf8.DecodeRuneInString(name[strings.IndexFunc(name, func(r rune) bool { return !isSnapshotRune(r) }):])
		problem = fmt.Sprintf("it contains %q; only letters, digits, '.', '_' and '-' are allowed", r)
	}
	return fmt.Errorf("validating snapshot name %q: %s (use something like \"before-upgrade\" or \"v2.1\", matching %s)",
		name, problem, snapshotPattern.String())
}

func isSnapshotRune(r rune) bool { return r == '.' || !isBadNameRune(r) }
