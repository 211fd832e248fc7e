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

// specialUse are the zones below which no name is forwarded: RFC 6761's
// localhost, RFC 6762 (local), RFC 7686 (onion),
// RFC 8375 (home.arpa), RFC 9476 (alt), RFC 9462 (resolver.arpa), RFC 8880
// (ipv4only.arpa, synthesised by NAT64 hosts), ICANN's private-use .internal,
// and the undelegated names home networks and companies use (lan, home,
// corp, localdomain, intranet, private). RFC 6761's test, example and
// invalid are not here: no network gives them a local meaning, an upstream
// answers NXDOMAIN for them, and abox's own tests name their servers so.
var specialUse = []string{
	"localhost", "local", "internal", "home.arpa", "onion", "alt", "resolver.arpa", "ipv4only.arpa", "lan", "home", "corp",
	"localdomain", "intranet", "private",
}

// SpecialUse reports whether n, a name returned by NormalizeName, is a
// single-label name or lies in (or is) a special-use zone.
func SpecialUse(n string) bool {
	if !strings.Contains(n, ".") {
		return true // single label: _gateway, wpad, the host's own name
	}
	for _, z := range specialUse {
		if n == z || strings.HasSuffix(n, z) && n[len(n)-len(z)-1] == '.' {
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
