package policy

import (
	"strconv"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// The entries of the two IANA registries of names that are reserved or
// served locally, as published (RFC 6761's Special-Use Domain Names
// registry and RFC 6303's Locally-Served DNS Zones registry), and the
// names ICANN will never delegate. Each is refused in every mode, in
// passive mode too, except the few the filters forward on purpose (see
// allowlist.specialUseForwarded), which are listed here as such.
var (
	specialUseRegistry = []struct{ zone, source string }{
		{"6tisch.arpa", "RFC 9031"}, {"10.in-addr.arpa", "RFC 6761"}, {"168.192.in-addr.arpa", "RFC 6761"},
		{"170.0.0.192.in-addr.arpa", "RFC 8880"}, {"171.0.0.192.in-addr.arpa", "RFC 8880"},
		{"254.169.in-addr.arpa", "RFC 6762"}, {"8.e.f.ip6.arpa", "RFC 6762"}, {"9.e.f.ip6.arpa", "RFC 6762"},
		{"a.e.f.ip6.arpa", "RFC 6762"}, {"b.e.f.ip6.arpa", "RFC 6762"}, {"alt", "RFC 9476"},
		{"eap-noob.arpa", "RFC 9140"}, {"home.arpa", "RFC 8375"}, {"ipv4only.arpa", "RFC 8880"},
		{"local", "RFC 6762"}, {"localhost", "RFC 6761"}, {"onion", "RFC 7686"}, {"resolver.arpa", "RFC 9462"},
		{"service.arpa", "RFC 9665"},
		// Forwarded on purpose.
		{"example", "RFC 6761"}, {"example.com", "RFC 6761"}, {"example.net", "RFC 6761"},
		{"example.org", "RFC 6761"}, {"invalid", "RFC 6761"}, {"test", "RFC 6761"},
	}
	locallyServedRegistry = []struct{ zone, source string }{
		{"10.in-addr.arpa", "RFC 6303"}, {"168.192.in-addr.arpa", "RFC 6303"}, {"0.in-addr.arpa", "RFC 6303"},
		{"127.in-addr.arpa", "RFC 6303"}, {"254.169.in-addr.arpa", "RFC 6303"}, {"2.0.192.in-addr.arpa", "RFC 6303"},
		{"100.51.198.in-addr.arpa", "RFC 6303"}, {"113.0.203.in-addr.arpa", "RFC 6303"},
		{"255.255.255.255.in-addr.arpa", "RFC 6303"},
		{"0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa", "RFC 6303"},
		{"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa", "RFC 6303"},
		{"d.f.ip6.arpa", "RFC 6303"}, {"8.e.f.ip6.arpa", "RFC 6303"}, {"9.e.f.ip6.arpa", "RFC 6303"},
		{"a.e.f.ip6.arpa", "RFC 6303"}, {"b.e.f.ip6.arpa", "RFC 6303"}, {"8.b.d.0.1.0.0.2.ip6.arpa", "RFC 6303"},
		{"home.arpa", "RFC 8375"},
	}
	neverDelegated = []struct{ zone, source string }{
		{"internal", "ICANN 2024"}, {"corp", "ICANN name collision"}, {"home", "ICANN name collision"},
		{"mail", "ICANN name collision"},
	}
	forwardedOnPurpose = map[string]bool{"example": true, "example.com": true, "example.net": true, "example.org": true, "invalid": true, "test": true}
)

func init() {
	for i := 16; i <= 31; i++ { // 172.16.0.0/12
		z := strconv.Itoa(i) + ".172.in-addr.arpa"
		specialUseRegistry = append(specialUseRegistry, struct{ zone, source string }{z, "RFC 6761"})
		locallyServedRegistry = append(locallyServedRegistry, struct{ zone, source string }{z, "RFC 6303"})
	}
	for i := 64; i <= 127; i++ { // 100.64.0.0/10
		locallyServedRegistry = append(locallyServedRegistry, struct{ zone, source string }{strconv.Itoa(i) + ".100.in-addr.arpa", "RFC 7793"})
	}
}

// under returns a name inside zone: a host name for a forward zone, a
// complete reverse name (an address in the range) for a reverse zone.
func under(zone string) string {
	if n, ok := strings.CutSuffix(zone, ".in-addr.arpa"); ok {
		labels := strings.Count(n, ".") + 1
		return strings.Repeat("1.", 4-labels) + zone
	}
	if n, ok := strings.CutSuffix(zone, ".ip6.arpa"); ok {
		labels := strings.Count(n, ".") + 1
		return strings.Repeat("1.", 32-labels) + zone
	}
	return "host." + zone
}

// TestReservedNamesRefused: every name of the registries, and a name in
// it, is refused in every mode (special_use_name, or private_reverse for
// the reverse zones), except those forwarded on purpose.
func TestReservedNamesRefused(t *testing.T) {
	for _, m := range []Mode{Active, Passive} {
		for _, set := range [][]struct{ zone, source string }{specialUseRegistry, locallyServedRegistry, neverDelegated} {
			for _, e := range set {
				for _, n := range []string{e.zone, under(e.zone)} {
					d := Evaluate(nil, m, n)
					if forwardedOnPurpose[e.zone] {
						if n == e.zone && !strings.Contains(n, ".") {
							continue // a single label is refused as one
						}
						if d.Reason == allowlist.ReasonSpecialUse || d.Reason == ReasonPrivateReverse {
							t.Errorf("%s: %s (%s) is forwarded on purpose, got %+v", m, n, e.source, d)
						}
						continue
					}
					if d.Verdict != allowlist.Block || d.Reason != allowlist.ReasonSpecialUse && d.Reason != ReasonPrivateReverse {
						t.Errorf("%s: %s (%s) = %+v, want refused as special_use_name or private_reverse", m, n, e.source, d)
					}
				}
			}
		}
	}
}
