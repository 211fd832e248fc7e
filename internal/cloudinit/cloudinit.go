// Package cloudinit renders an instance's cloud-init NoCloud seed (meta-data, user-data, network-config) and packs it into the seed ISO.
package cloudinit

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/abox-dev/abox/internal/validate"
)

// Config is what the seed needs to know about an instance.
type Config struct {
	Name string // instance name; validate.InstanceName must accept it
	UUID string // the instance's creation UUID; with Name it fixes the instance-id

	User          string // guest login user, a POSIX user name such as "abox"
	AuthorizedKey string // one authorized_keys line (GenerateSSHKey returns it)
	CACertPEM     string // the instance CA certificate(s), PEM; the proxy's MITM root

	MAC       string       // guest NIC MAC; the network config matches it
	Subnet    netip.Prefix // the instance /24
	GuestIP   netip.Addr   // static address inside Subnet (conventionally .10)
	Gateway   netip.Addr   // router, resolver and proxy host inside Subnet (conventionally .1)
	ProxyPort uint16       // TCP port of the HTTP proxy on Gateway
}

var (
	uuidPattern = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	// userPattern is Debian's default NAME_REGEX for adduser, minus the
	// trailing '$' some systems allow; it keeps the name out of trouble in
	// sudoers and paths.
	userPattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
)

// Validate checks every field; the seed is generated only from values
// that passed.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := validate.InstanceName(c.Name); err != nil {
		errs = append(errs, err)
	}
	if !uuidPattern.MatchString(c.UUID) {
		add("uuid %q: want lowercase 8-4-4-4-12 hex", c.UUID)
	}
	if !userPattern.MatchString(c.User) || c.User == "root" {
		add("user %q: want a lowercase POSIX user name other than root, such as \"abox\"", c.User)
	}
	if err := checkAuthorizedKey(c.AuthorizedKey); err != nil {
		errs = append(errs, err)
	}
	if err := checkCA(c.CACertPEM); err != nil {
		errs = append(errs, err)
	}
	if err := validate.GuestMAC(c.MAC); err != nil {
		errs = append(errs, err)
	}
	if !c.Subnet.IsValid() || !c.Subnet.Addr().Is4() || c.Subnet != c.Subnet.Masked() {
		add("subnet %v: want a masked IPv4 prefix", c.Subnet)
	} else {
		for _, a := range []struct {
			what string
			ip   netip.Addr
		}{{"guest ip", c.GuestIP}, {"gateway", c.Gateway}} {
			if !a.ip.Is4() || !c.Subnet.Contains(a.ip) || a.ip == c.Subnet.Addr() {
				add("%s %v: want a host address inside %v", a.what, a.ip, c.Subnet)
			}
		}
		if c.GuestIP == c.Gateway {
			add("guest ip %v: must differ from the gateway", c.GuestIP)
		}
	}
	if c.ProxyPort == 0 {
		add("proxy port: must be set")
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checking cloud-init config for %q: %w", c.Name, err)
	}
	return nil
}

func checkAuthorizedKey(line string) error {
	// A newline would let one "key" add a second authorized_keys entry.
	if strings.ContainsAny(line, "\r\n") {
		return fmt.Errorf("authorized key: must be a single line")
	}
	pub, _, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return fmt.Errorf("authorized key: %w", err)
	}
	if len(options) > 0 || len(rest) > 0 {
		return fmt.Errorf("authorized key: want a bare key without options")
	}
	if pub.Type() != ssh.KeyAlgoED25519 {
		return fmt.Errorf("authorized key: type %s, want ssh-ed25519", pub.Type())
	}
	return nil
}

func checkCA(pemText string) error {
	rest := []byte(pemText)
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("ca certificate: PEM block %q, want CERTIFICATE (never a private key)", b.Type)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return fmt.Errorf("ca certificate: %w", err)
		}
		if !cert.IsCA {
			return fmt.Errorf("ca certificate: %q is not a CA certificate", cert.Subject)
		}
		n++
	}
	if n == 0 || strings.TrimSpace(string(rest)) != "" {
		return fmt.Errorf("ca certificate: want one or more PEM CERTIFICATE blocks and nothing else")
	}
	return nil
}

// InstanceID is the cloud-init instance-id. cloud-init reruns its
// once-per-instance modules (users, keys, host keys) whenever the id
// changes, so it must stay the same across starts of one instance and
// differ between two instances that reuse a name.
func InstanceID(name, uuid string) string { return "abox-" + name + "-" + uuid }

// Hostname turns an instance name into a valid hostname label: instance
// names may contain '_' and end in '-', hostnames may not.
func Hostname(name string) string {
	h := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
	return strings.TrimRight(h, "-")
}

// ProxyURL is the proxy address guests use for both http and https.
func (c Config) ProxyURL() string {
	return "http://" + netip.AddrPortFrom(c.Gateway, c.ProxyPort).String()
}

func (c Config) guestPrefix() string {
	return netip.PrefixFrom(c.GuestIP, c.Subnet.Bits()).String()
}
