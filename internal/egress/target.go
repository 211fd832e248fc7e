// Package egress turns a guest-supplied destination into a connection the
// host may make on the guest's behalf: parse the target, resolve it once,
// classify every address, and dial exactly the addresses that were checked.
package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
)

// Target is a parsed destination. Exactly one of Name and Addr is set.
type Target struct {
	// Name is a host name normalised by allowlist.NormalizeName (lowercase
	// ASCII, no trailing dot); empty when the host is an IP literal.
	Name string
	// Addr is the IP literal, unmapped and without zone; invalid for names.
	Addr netip.Addr
	// Port is 1-65535.
	Port uint16
}

// IsIP reports whether the target was an IP literal.
func (t Target) IsIP() bool { return t.Addr.IsValid() }

// Host is the normalised host: the name, or the canonical address text.
func (t Target) Host() string {
	if t.IsIP() {
		return t.Addr.String()
	}
	return t.Name
}

// Authority renders host:port, bracketing IPv6.
func (t Target) Authority() string {
	return hostPort(t.Host(), t.Addr.Is6(), t.Port)
}

// HostHeader renders the authority as a Host header value: the port is left
// out when it is the scheme's default.
func (t Target) HostHeader(defaultPort uint16) string {
	if t.Port == defaultPort {
		if t.Addr.Is6() {
			return "[" + t.Host() + "]"
		}
		return t.Host()
	}
	return t.Authority()
}

// Same reports whether two targets name the same host and port.
func (t Target) Same(o Target) bool {
	return t.Name == o.Name && t.Addr == o.Addr && t.Port == o.Port
}

func hostPort(host string, v6 bool, port uint16) string {
	p := strconv.Itoa(int(port))
	if v6 {
		return "[" + host + "]:" + p
	}
	return host + ":" + p
}

// ErrInvalidTarget wraps every parse failure.
var ErrInvalidTarget = errors.New("invalid target")

func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidTarget, fmt.Sprintf(format, a...))
}

// ParseAuthority parses host[:port] as found in a CONNECT request target, a
// Host header, an HTTP/2 :authority or the authority of an absolute URL.
// defaultPort applies when no port is given; 0 makes the port mandatory.
//
// The parser is deliberately stricter than browsers: userinfo, unbracketed
// IPv6, double percent-encoding and anything numeric that is not a valid
// IPv4 address are refused. Every host that inet_aton(3) would read as an
// address (2130706433, 0177.0.0.1, 0x7f.1, 127.1) is returned as that address,
// so it is classified rather than sent to a resolver.
func ParseAuthority(s string, defaultPort uint16) (Target, error) {
	if s == "" {
		return Target{}, invalid("empty authority")
	}
	if len(s) > 1024 {
		return Target{}, invalid("authority longer than 1024 bytes")
	}
	if strings.ContainsAny(s, "@/?#\\ \t\r\n") {
		return Target{}, invalid("authority %q holds userinfo, a path or whitespace", s)
	}
	host, portStr := s, ""
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return Target{}, invalid("unterminated bracket in %q", s)
		}
		host, portStr = s[:end+1], s[end+1:]
		if portStr != "" {
			if portStr[0] != ':' {
				return Target{}, invalid("garbage after bracketed address in %q", s)
			}
			portStr = portStr[1:]
			if portStr == "" {
				return Target{}, invalid("empty port in %q", s)
			}
		}
	} else if i := strings.LastIndexByte(s, ':'); i >= 0 {
		if strings.Count(s, ":") > 1 {
			return Target{}, invalid("IPv6 address %q must be in brackets", s)
		}
		host, portStr = s[:i], s[i+1:]
		if portStr == "" {
			return Target{}, invalid("empty port in %q", s)
		}
	}
	var port uint16
	if portStr == "" {
		if defaultPort == 0 {
			return Target{}, invalid("no port in %q", s)
		}
		port = defaultPort
	} else {
		p, err := parsePort(portStr)
		if err != nil {
			return Target{}, err
		}
		port = p
	}
	t, err := ParseHost(host)
	if err != nil {
		return Target{}, err
	}
	t.Port = port
	return t, nil
}

func parsePort(s string) (uint16, error) {
	if len(s) > 5 {
		return 0, invalid("port %q out of range", s)
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, invalid("port %q is not a number", s)
		}
		n = n*10 + int(s[i]-'0')
	}
	if n < 1 || n > 65535 {
		return 0, invalid("port %q out of range", s)
	}
	return uint16(n), nil
}

// ParseHost parses a host without port: a bracketed IPv6 address (zone
// allowed, percent-encoded as %25 or not), an IPv4 address in any notation
// inet_aton accepts, or a host name (percent-encoding and IDNA allowed). The
// returned Target has Port 0.
func ParseHost(h string) (Target, error) {
	if h == "" {
		return Target{}, invalid("empty host")
	}
	if strings.HasPrefix(h, "[") {
		if !strings.HasSuffix(h, "]") || len(h) < 3 {
			return Target{}, invalid("malformed bracketed address %q", h)
		}
		inner := h[1 : len(h)-1]
		// RFC 6874 encodes the zone separator as %25; accept a bare % too.
		inner = strings.Replace(inner, "%25", "%", 1)
		a, err := netip.ParseAddr(inner)
		if err != nil || !a.Is6() {
			return Target{}, invalid("malformed IPv6 address %q", h)
		}
		return Target{Addr: a.WithZone("").Unmap()}, nil
	}
	dec, err := percentDecode(h)
	if err != nil {
		return Target{}, err
	}
	if strings.ContainsAny(dec, "%[]:@/\\") {
		return Target{}, invalid("host %q holds characters no host name has", h)
	}
	if a, ok, err := numericHost(dec); ok || err != nil {
		if err != nil {
			return Target{}, err
		}
		return Target{Addr: a}, nil
	}
	n, err := allowlist.NormalizeName(dec)
	if err != nil {
		return Target{}, invalid("host %q: %v", h, err)
	}
	// IDNA mapping turns fullwidth digits and ideographic dots into ASCII:
	// look again so "１２７。０。０。１" is the address it spells.
	if a, ok, err := numericHost(n); ok || err != nil {
		if err != nil {
			return Target{}, err
		}
		return Target{Addr: a}, nil
	}
	return Target{Name: n}, nil
}

func percentDecode(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
			return "", invalid("bad percent-encoding in %q", s)
		}
		b.WriteByte(byte(unhex(s[i+1])<<4 | unhex(s[i+2])))
		i += 2
	}
	return b.String(), nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// numericHost implements the WHATWG "ends in a number" rule: if the last
// label is a number (decimal, or 0x-prefixed hex), the host is an IPv4
// literal and nothing else. Only the canonical form is accepted: four
// decimal parts of 0-255 without leading zeros. inet_aton's other forms
// (2130706433, 0x7f.1, 0177.0.0.1, 127.1, mixed radix) are refused rather
// than guessed: resolvers, URL parsers and upstream servers disagree on
// them, so what was checked need not be what another component reaches. ok
// reports that the host was numeric.
func numericHost(s string) (netip.Addr, bool, error) {
	s = strings.TrimSuffix(s, ".")
	if !isNumber(s[strings.LastIndexByte(s, '.')+1:]) { // the last label
		return netip.Addr{}, false, nil
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
		return a, true, nil
	}
	return netip.Addr{}, true, invalid("host %q is an IPv4 address in an ambiguous notation (fewer than four parts, leading zeros, octal or hex); write it as four decimal numbers such as 93.184.215.14", s)
}

// isNumber reports whether a label is numeric in the WHATWG sense: digits
// only, or 0x followed by hex digits (possibly none).
func isNumber(p string) bool {
	if p == "" {
		return false
	}
	if len(p) >= 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X') {
		for i := 2; i < len(p); i++ {
			if unhex(p[i]) < 0 {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}
