package policy

import (
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// TestPrivateReverseBlockedInEveryMode: a reverse-mapping name that is not a
// complete public address is blocked as private_reverse by the shared
// decision, so the proxy (and abox explain) refuse it like the DNS filter,
// in both modes and even when an entry such as *.10.in-addr.arpa names it;
// it is never recorded in the passive profile. A public one follows the
// allowlist.
func TestPrivateReverseBlockedInEveryMode(t *testing.T) {
	e := newEngine(t, "*.10.in-addr.arpa\n14.215.184.93.in-addr.arpa\n")
	private := []string{
		"5.0.0.10.in-addr.arpa", "1.0.0.127.in-addr.arpa", "0.10.in-addr.arpa", "in-addr.arpa", "ip6.arpa",
		"1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa",
		"x.5.0.0.10.in-addr.arpa", "05.0.0.10.in-addr.arpa",
	}
	for _, m := range []Mode{Active, Passive} {
		e.SetMode(m)
		for _, n := range private {
			if d := e.Decide(n); d.Verdict != allowlist.Block || d.Reason != ReasonPrivateReverse {
				t.Errorf("%s: Decide(%s) = %+v, want block %s", m, n, d, ReasonPrivateReverse)
			}
		}
		if d := e.Decide("14.215.184.93.in-addr.arpa"); d.Verdict != allowlist.Allow || d.Reason != allowlist.ReasonAllowlisted {
			t.Errorf("%s: public reverse name = %+v, want allowlisted", m, d)
		}
	}
	for _, pe := range e.Profile().Entries {
		if pe.Name != "14.215.184.93.in-addr.arpa" {
			t.Errorf("passive profile recorded %s", pe.Name)
		}
	}
}
