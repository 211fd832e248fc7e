package libvirt

import (
	"slices"
	"strings"
	"testing"
)

func captureParams() Params {
	p := testParams()
	p.CaptureHTTPPort, p.CaptureTLSPort = 8180, 8443
	return p
}

// TestNWFilterCapture: capture adds exactly two rules, new TCP to the
// gateway's capture ports, after the other gateway services and before
// the default deny; every other rule stays as it is. Nothing admits a
// flow to an address but the gateway's.
func TestNWFilterCapture(t *testing.T) {
	rules := func(p Params) []string {
		t.Helper()
		f, err := BuildNWFilter(p)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for i, e := range f.Entries {
			out = append(out, e.Rule.Action+" "+e.Rule.Direction+" "+describe(e.Rule))
			if i > 0 && e.Rule.Priority <= f.Entries[i-1].Rule.Priority {
				t.Errorf("rule %d priority %d not above the one before it", i, e.Rule.Priority)
			}
		}
		return out
	}
	off, on := rules(testParams()), rules(captureParams())
	at := slices.Index(off, "accept out tcp dst=10.10.5.1 dport=53 state=NEW") + 1
	want := slices.Insert(slices.Clone(off), at,
		"accept out tcp dst=10.10.5.1 dport=8180 state=NEW",
		"accept out tcp dst=10.10.5.1 dport=8443 state=NEW")
	if strings.Join(on, "\n") != strings.Join(want, "\n") {
		t.Errorf("with capture the filter is\n%s\nwant\n%s", strings.Join(on, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range on {
		if strings.HasPrefix(r, "accept out") && strings.Contains(r, "dst=") && !strings.Contains(r, "dst=10.10.5.1 ") {
			t.Errorf("rule %q admits a destination other than the gateway", r)
		}
	}
	got, err := NWFilterXML(captureParams())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "nwfilter-capture.xml", got+"\n")
}

func TestCapturePortsChecked(t *testing.T) {
	for _, tc := range []struct {
		name      string
		http, tls uint16
	}{{"one only", 8180, 0}, {"same", 8180, 8180}, {"proxy's", 8080, 8443}, {"dns", 8180, 53}} {
		p := testParams()
		p.CaptureHTTPPort, p.CaptureTLSPort = tc.http, tc.tls
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "capture port") {
			t.Errorf("%s: Validate = %v, want a capture port error", tc.name, err)
		}
	}
	if err := captureParams().Validate(); err != nil {
		t.Errorf("capture ports 8180, 8443: %v", err)
	}
}
