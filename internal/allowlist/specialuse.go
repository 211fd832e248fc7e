package allowlist

import "strings"

// ReasonSpecialUse: a single-label name, or a name in a local or special-use
// namespace. Such a name means something only on some host's own network or
// resolver (mDNS, systemd-resolved's _gateway, a home router, a corporate
// resolver), so it is never forwarded upstream and never allowed, in any mode.
const ReasonSpecialUse = "special_use_name"

// ReasonSpecialUseAlias: an allowed name whose answer is an alias (a CNAME
// chain) through a name the filters would refuse as special_use_name or
// invalid_name. The upstream followed the alias itself, and a host's
// resolver routes such a name to mDNS, LLMNR, /etc/hosts or a split-DNS
// link, so the answer may describe the host's network rather than the
// internet: a guest with a record under an allowed zone could launder any
// local name through it.
const ReasonSpecialUseAlias = "special_use_alias"

// specialUse are the zones below which no name is forwarded, each with
// where it is reserved. They come from the IANA Special-Use Domain Names
// registry (RFC 6761) and the Locally-Served DNS Zones registry (RFC 6303)
// — forward names here; their reverse zones, and every other reverse name
// of a non-public range, are refused by the reverse check (policy:
// private_reverse) — and from the names ICANN will never delegate and
// networks use locally. The test of package policy lists every entry of
// both registries with its source and checks each is refused.
var specialUse = []struct{ zone, source string }{
	{"localhost", "RFC 6761 6.3; IANA special-use"},
	{"local", "RFC 6762 (mDNS); IANA special-use"},
	{"onion", "RFC 7686 (Tor); IANA special-use"},
	{"alt", "RFC 9476; IANA special-use"},
	{"home.arpa", "RFC 8375 (home networks); IANA special-use and locally-served"},
	{"resolver.arpa", "RFC 9462 (DDR); IANA special-use"},
	{"ipv4only.arpa", "RFC 8880 (NAT64 discovery, synthesised locally); IANA special-use"},
	{"service.arpa", "RFC 9665 (DNS-SD service registration); IANA special-use"},
	{"6tisch.arpa", "RFC 9031 (6TiSCH join); IANA special-use"},
	{"eap-noob.arpa", "RFC 9140 (EAP-NOOB); IANA special-use"},
	{"internal", "ICANN board resolution 2024.07.29.06: reserved for private use, never delegated"},
	{"corp", "ICANN name collision: deferred indefinitely (2014), used by corporate networks"},
	{"home", "ICANN name collision: deferred indefinitely (2014), used by home routers"},
	{"mail", "ICANN name collision: deferred indefinitely (2014)"},
	{"lan", "undelegated; the LAN of home routers (OpenWrt, dnsmasq defaults)"},
	{"localdomain", "undelegated; the local domain of Linux distributions' /etc/hosts"},
	{"intranet", "undelegated; RFC 6762 appendix G lists it among private names"},
	{"private", "undelegated; RFC 6762 appendix G lists it among private names"},
}

// specialUseForwarded are the names of the IANA Special-Use Domain Names
// registry that are forwarded, with why: no network gives them a local
// meaning, an upstream answers them honestly (NXDOMAIN, or the IANA's own
// example.* hosts), and abox's own tests and demo name their servers
// under test.
var specialUseForwarded = []struct{ zone, why string }{
	{"test", "RFC 6761 6.2: resolvers answer NXDOMAIN; abox's tests and demo use it"},
	{"example", "RFC 6761 6.5: documentation, NXDOMAIN upstream"},
	{"example.com", "RFC 6761 6.5: documentation, served by the IANA"},
	{"example.net", "RFC 6761 6.5: documentation, served by the IANA"},
	{"example.org", "RFC 6761 6.5: documentation, served by the IANA"},
	{"invalid", "RFC 6761 6.4: resolvers answer NXDOMAIN"},
}

// SpecialUse reports whether n, a name returned by NormalizeName, is a
// single-label name or lies in (or is) a special-use zone.
func SpecialUse(n string) bool {
	if !strings.Contains(n, ".") {
		return true // single label: _gateway, wpad, the host's own name
	}
	for _, e := range specialUse {
		if z := e.zone; n == z || strings.HasSuffix(n, z) && n[len(n)-len(z)-1] == '.' {
			return true
		}
	}
	return false
}

// NumericName reports whether n, a name returned by NormalizeName, ends in a
// label that starts with a digit. No top-level domain does, so such a name is
// an IP address in some notation (127.1, 0x7f.1, 2130706433, 10.0.0.1):
// URL parsers and resolvers read it as an address and disagree on which, so
// the filters never treat it as a name, in any mode.
func NumericName(n string) bool {
	last := n[strings.LastIndexByte(n, '.')+1:]
	return last != "" && last[0] >= '0' && last[0] <= '9'
}

// LocalName reports whether name, a host name as a DNS message holds it
// (any case, a trailing dot or not, presentation-format escapes kept), is
// one the filters never let a guest resolve: single-label (the root too),
// in a special-use zone, or numeric (see NumericName). It is the test for
// alias targets, which the upstream follows without asking the filters.
func LocalName(name string) bool {
	n := strings.ToLower(strings.TrimSuffix(name, "."))
	return SpecialUse(n) || NumericName(n)
}
