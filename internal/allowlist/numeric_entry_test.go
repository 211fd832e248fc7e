package allowlist

import (
	"strings"
	"testing"
)

// TestParseEntryRefusesNumericNames: an entry whose last label starts with
// a digit (which the filters read as an address and refuse as invalid_name
// in every mode) is refused when it is written, instead of being accepted
// and then never matching.
func TestParseEntryRefusesNumericNames(t *testing.T) {
	for _, s := range []string{"foo.1z", "*.example.9xyz", "host.0-x", "a.b.1_", "Example.7Q."} {
		if e, err := ParseEntry(s); err == nil {
			t.Errorf("ParseEntry(%q) = %v, want an error", s, e)
		} else if !strings.Contains(err.Error(), "IP address") {
			t.Errorf("ParseEntry(%q): %v, want it to say the name reads as an IP address", s, err)
		}
	}
	for _, s := range []string{"1password.com", "*.9gag.com", "x.y2k.example"} {
		if _, err := ParseEntry(s); err != nil {
			t.Errorf("ParseEntry(%q): %v, want it accepted (only the last label counts)", s, err)
		}
	}
}
