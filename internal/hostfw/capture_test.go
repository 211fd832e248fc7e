package hostfw

import (
	"strings"
	"testing"
)

// cb is the test bridge with capture on.
var cb = func() Bridge { b := bb; b.CaptureHTTPPort, b.CaptureTLSPort = 3180, 3443; return b }()

// TestCaptureTable pins the table with capture on: the answer chain lets
// TCP to port 80 and 443 of other addresses through (the capture chain
// takes it), and the capture chain DNATs exactly that, from the guest's
// own address on its own bridge, to the gateway's capture ports.
func TestCaptureTable(t *testing.T) {
	got := answerTable(cb)
	golden(t, "capture-table.nft", got)
	for _, want := range []string{
		"ip daddr 10.10.7.1 tcp dport { 53, 3128, 3180, 3443 } return",
		"ip daddr != 10.10.7.1 tcp dport { 80, 443 } return",
		"type nat hook prerouting priority dstnat; policy accept;",
		`iifname "` + br + `" ip saddr 10.10.7.10 ip daddr != 10.10.7.1 tcp dport 80 dnat to 10.10.7.1:3180`,
		`iifname "` + br + `" ip saddr 10.10.7.10 ip daddr != 10.10.7.1 tcp dport 443 dnat to 10.10.7.1:3443`,
	} {
		if !strings.Contains(got, "\t\t"+want+"\n") {
			t.Errorf("capture table lacks %q:\n%s", want, got)
		}
	}
	// The pass for 80 and 443 comes after the source checks and before
	// the answers.
	pass := strings.Index(got, "tcp dport { 80, 443 } return")
	if pass < strings.Index(got, "ct state != new") || pass > strings.Index(got, "reject with tcp reset") {
		t.Errorf("the capture pass is not between the source checks and the answers:\n%s", got)
	}
	// Without capture nothing of it is there: the table is what it was.
	if off := answerTable(bb); strings.Contains(off, "dnat") || strings.Contains(off, "80, 443") || strings.Contains(off, "3180") {
		t.Errorf("capture off, yet the table holds capture rules:\n%s", off)
	}
}

// TestCaptureInputChain: the input chain admits the capture ports on the
// gateway, new connections only, and nothing more; without capture it
// holds what it held.
func TestCaptureInputChain(t *testing.T) {
	in := func(b Bridge) []string { return specs("iptables", b)[2].rules() }
	on, off := in(cb), in(bb)
	var added []string
	for _, r := range on {
		if !strings.Contains(strings.Join(off, "\n"), r) {
			added = append(added, r)
		}
	}
	want := []string{
		"-A ABOXI-" + br + " -d 10.10.7.1/32 -p tcp -m tcp --dport 3180 -m conntrack --ctstate NEW -j RETURN",
		"-A ABOXI-" + br + " -d 10.10.7.1/32 -p tcp -m tcp --dport 3443 -m conntrack --ctstate NEW -j RETURN",
	}
	if strings.Join(added, "\n") != strings.Join(want, "\n") {
		t.Errorf("capture adds %q to the input chain, want exactly %q", added, want)
	}
	if on[len(on)-1] != "-A ABOXI-"+br+" -j DROP" {
		t.Errorf("input chain with capture ends in %q, want the DROP", on[len(on)-1])
	}
}

func TestCapturePortsValidated(t *testing.T) {
	for _, tc := range []struct {
		name      string
		http, tls uint16
	}{
		{"only one", 3180, 0},
		{"same port", 3180, 3180},
		{"proxy port", 3128, 3443},
		{"dns port", 53, 3443},
	} {
		b := bb
		b.CaptureHTTPPort, b.CaptureTLSPort = tc.http, tc.tls
		if err := b.validate(); err == nil || !strings.Contains(err.Error(), "capture port") {
			t.Errorf("%s (%d, %d): validate = %v, want a capture port error", tc.name, tc.http, tc.tls, err)
		}
	}
	if err := cb.validate(); err != nil {
		t.Errorf("valid capture ports: %v", err)
	}
}
