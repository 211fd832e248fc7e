package policy

import (
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// TestHealthcheckIsOneExactName: the healthcheck verdict is for
// healthcheck.abox.local only. Names that start, end or contain it are
// ordinary names: blocked in active mode, passive_mode (and recorded) in
// passive mode, never reason healthcheck.
func TestHealthcheckIsOneExactName(t *testing.T) {
	e := newEngine(t, "example.com\n")
	lookalikes := []string{"healthcheck.abox.local.evil.test", "healthcheck.abox.localx", "xhealthcheck.abox.local.example.org", "a.healthcheck.abox.local.example.org"}
	for _, m := range []Mode{Active, Passive} {
		e.SetMode(m)
		if d := e.Decide("HealthCheck.abox.local."); d.Verdict != allowlist.Allow || d.Reason != ReasonHealthcheck {
			t.Errorf("%s: healthcheck name = %+v, want allow healthcheck", m, d)
		}
		for _, n := range lookalikes {
			d := e.Decide(n)
			if d.Reason == ReasonHealthcheck {
				t.Errorf("%s: %s decided as the healthcheck: %+v", m, n, d)
			}
			want := allowlist.Decision{Verdict: allowlist.Block, Reason: allowlist.ReasonNotAllowlisted}
			if m == Passive {
				want = allowlist.Decision{Verdict: allowlist.Allow, Reason: ReasonPassive}
			}
			if d != want {
				t.Errorf("%s: Decide(%s) = %+v, want %+v", m, n, d, want)
			}
		}
	}
}

// TestSpecialUseBlockedInEveryMode: local and special-use names are blocked
// with their own reason in both modes, are never recorded in the passive
// profile, and cannot be allowlisted.
func TestSpecialUseBlockedInEveryMode(t *testing.T) {
	e := newEngine(t, "example.com\n")
	names := []string{"_gateway", "localhost", "a.localhost", "printer.local", "metadata.google.internal", "r.home.arpa", "nas.lan", "x.onion"}
	for _, m := range []Mode{Active, Passive} {
		e.SetMode(m)
		for _, n := range names {
			if d := e.Decide(n); d.Verdict != allowlist.Block || d.Reason != allowlist.ReasonSpecialUse {
				t.Errorf("%s: Decide(%s) = %+v, want block %s", m, n, d, allowlist.ReasonSpecialUse)
			}
		}
	}
	if p := e.Profile(); len(p.Entries) != 0 {
		t.Errorf("passive profile recorded special-use names: %+v", p.Entries)
	}
	for _, n := range []string{"printer.local", "*.corp.internal", "db.localhost", "*.home.arpa"} {
		if _, err := e.Add(n); err == nil {
			t.Errorf("Add(%s) accepted a special-use name", n)
		}
	}
	// Look-alikes in public zones are ordinary names.
	for _, n := range []string{"local.example.com", "internal.example.com", "mylan.com", "localhost.example.com"} {
		if allowlist.SpecialUse(n) {
			t.Errorf("SpecialUse(%s) = true for a public name", n)
		}
	}
}

// TestNumericNamesAreNotNames: a name whose last label starts with a digit
// is an IP address in some notation; it is invalid in every mode, not
// recorded, and never matched against the allowlist.
func TestNumericNamesAreNotNames(t *testing.T) {
	e := newEngine(t, "example.com\n*.example.com\n")
	for _, m := range []Mode{Active, Passive} {
		e.SetMode(m)
		for _, n := range []string{"127.0.0.1", "127.1", "0x7f.1", "2130706433", "a.example.com.123", "10.0.0.1."} {
			if d := e.Decide(n); d.Verdict != allowlist.Block || d.Reason != allowlist.ReasonInvalidName {
				t.Errorf("%s: Decide(%s) = %+v, want block %s", m, n, d, allowlist.ReasonInvalidName)
			}
		}
		if d := e.Decide("www.example.com"); d.Verdict != allowlist.Allow {
			t.Errorf("%s: a name with digits elsewhere = %+v", m, d)
		}
		if d := e.Decide("1password.example.com"); d.Verdict != allowlist.Allow {
			t.Errorf("%s: a name starting with a digit = %+v", m, d)
		}
	}
	for _, en := range e.Profile().Entries {
		if allowlist.NumericName(en.Name) {
			t.Errorf("passive profile recorded numeric name %q", en.Name)
		}
	}
}
