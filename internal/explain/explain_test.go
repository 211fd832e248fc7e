package explain

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

func list(t *testing.T, text string) *allowlist.List {
	t.Helper()
	l, err := allowlist.Parse(strings.NewReader(text), "test")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestExplain(t *testing.T) {
	l := list(t, "example.com\n*.example.org\ntunnel.test\n")
	permit := []netip.Prefix{netip.MustParsePrefix("10.99.0.0/16")}
	base := Policy{List: l, Mode: policy.Active, Addresses: netclass.NewPolicy(permit, nil), MITMExceptions: []string{"tunnel.test"}}
	passive := base
	passive.Mode = policy.Passive
	ports := base
	ports.Ports = []uint16{443, 8443}

	tests := []struct {
		name    string
		p       Policy
		target  string
		verdict allowlist.Verdict
		reason  string
		rule    string
		dns     allowlist.Verdict
		port    uint16
		tls     string
	}{
		{"exact name", base, "example.com", allowlist.Allow, allowlist.ReasonAllowlisted, "example.com", allowlist.Allow, 443, "intercepted"},
		{"case and trailing dot", base, "EXAMPLE.com.", allowlist.Allow, allowlist.ReasonAllowlisted, "example.com", allowlist.Allow, 443, "intercepted"},
		{"subdomain of exact is not allowed", base, "www.example.com", allowlist.Block, allowlist.ReasonNotAllowlisted, "", allowlist.Block, 443, ""},
		{"wildcard", base, "https://a.b.example.org/x?y", allowlist.Allow, allowlist.ReasonAllowlisted, "*.example.org", allowlist.Allow, 443, "intercepted"},
		{"wildcard excludes apex", base, "example.org", allowlist.Block, allowlist.ReasonNotAllowlisted, "", allowlist.Block, 443, ""},
		{"http url port 80", base, "http://example.com/", allowlist.Allow, allowlist.ReasonAllowlisted, "example.com", allowlist.Allow, 80, ""},
		{"port not allowed", base, "example.com:22", allowlist.Block, "port_not_allowed", "example.com", allowlist.Allow, 22, ""},
		{"configured ports", ports, "https://example.com:8443/", allowlist.Allow, allowlist.ReasonAllowlisted, "example.com", allowlist.Allow, 8443, "intercepted"},
		{"configured ports drop 80", ports, "http://example.com/", allowlist.Block, "port_not_allowed", "example.com", allowlist.Allow, 80, ""},
		{"mitm exception tunnels", base, "tunnel.test", allowlist.Allow, allowlist.ReasonAllowlisted, "tunnel.test", allowlist.Allow, 443, "tunnelled"},
		{"passive allows unlisted", passive, "unlisted.test", allowlist.Allow, policy.ReasonPassive, "", allowlist.Allow, 443, "intercepted"},
		{"private reverse name", passive, "5.0.0.10.in-addr.arpa", allowlist.Block, policy.ReasonPrivateReverse, "", allowlist.Block, 443, ""},
		{"healthcheck in active", base, "healthcheck.abox.local", allowlist.Allow, policy.ReasonHealthcheck, "", allowlist.Allow, 443, ""},
		{"healthcheck on any port", base, "healthcheck.abox.local:9", allowlist.Allow, policy.ReasonHealthcheck, "", allowlist.Allow, 9, ""},
		{"public literal active", base, "93.184.216.34", allowlist.Block, allowlist.ReasonNotAllowlisted, "", "", 443, ""},
		{"public literal passive", passive, "https://93.184.216.34/", allowlist.Allow, policy.ReasonPassive, "", "", 443, "intercepted"},
		{"private literal passive", passive, "http://192.168.1.1/", allowlist.Block, string(netclass.Private), "", "", 80, ""},
		{"loopback literal", passive, "127.0.0.1:443", allowlist.Block, string(netclass.Loopback), "", "", 443, ""},
		{"mapped v6 private", passive, "[::ffff:10.0.0.1]:443", allowlist.Block, string(netclass.Private), "", "", 443, ""},
		{"permitted range passive", passive, "10.99.1.2", allowlist.Allow, policy.ReasonPassive, "", "", 443, "intercepted"},
		{"permitted range active still unlisted", base, "10.99.1.2", allowlist.Block, allowlist.ReasonNotAllowlisted, "", "", 443, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Explain(tc.p, "", tc.target)
			if err != nil {
				t.Fatalf("Explain(%q): %v", tc.target, err)
			}
			if r.Verdict != tc.verdict || r.Proxy.Reason != tc.reason || r.Proxy.Rule != tc.rule {
				t.Errorf("proxy = %s/%s/%q, want %s/%s/%q (%s)", r.Verdict, r.Proxy.Reason, r.Proxy.Rule, tc.verdict, tc.reason, tc.rule, r.Proxy.Detail)
			}
			if r.DNS.Verdict != tc.dns {
				t.Errorf("dns verdict = %q, want %q", r.DNS.Verdict, tc.dns)
			}
			if r.Port != tc.port {
				t.Errorf("port = %d, want %d", r.Port, tc.port)
			}
			if !strings.HasPrefix(r.TLS, tc.tls) || (tc.tls == "") != (r.TLS == "") {
				t.Errorf("tls = %q, want prefix %q", r.TLS, tc.tls)
			}
			if r.Proxy.Detail == "" || r.DNS.Detail == "" {
				t.Errorf("missing detail: %+v", r)
			}
		})
	}
}

// The proxy refuses IPv4 literals in ambiguous notations (inet_aton's
// decimal, octal, hex and short forms) as invalid targets in every mode
// rather than guess what they mean; explain says so instead of classifying.
func TestExplainAmbiguousLiteral(t *testing.T) {
	p := Policy{List: list(t, "example.com\n"), Mode: policy.Passive}
	for _, target := range []string{"http://2130706433/", "0x7f.1", "0177.0.0.1:443"} {
		if _, err := Explain(p, "", target); err == nil || !strings.Contains(err.Error(), "ambiguous notation") {
			t.Errorf("Explain(%q) = %v, want the ambiguous notation refused", target, err)
		}
	}
}

func TestExplainNoMITM(t *testing.T) {
	p := Policy{List: list(t, "example.com\n"), NoMITM: true}
	r, err := Explain(p, "", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.TLS, "tunnelled") || r.Mode != policy.Active {
		t.Errorf("got tls %q mode %q", r.TLS, r.Mode)
	}
}

func TestExplainRecordsNothingInPassive(t *testing.T) {
	// Explain takes a list and a mode, not the engine: it cannot reach the
	// passive profile. This pins that the pure decision agrees with the
	// engine's and leaves the profile empty.
	dir := t.TempDir()
	e, err := policy.New(policy.Config{AllowlistPath: dir + "/allow.txt"})
	if err != nil {
		t.Fatal(err)
	}
	e.SetMode(policy.Passive)
	r, err := Explain(Policy{List: e.List(), Mode: e.Mode()}, "", "unlisted.test")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Decide("unlisted.test"); got.Reason != r.Proxy.Reason {
		t.Errorf("engine says %s, explain says %s", got.Reason, r.Proxy.Reason)
	}
	e.ClearProfile()
	Explain(Policy{List: e.List(), Mode: e.Mode()}, "", "other.test")
	if n := len(e.Profile().Entries); n != 0 {
		t.Errorf("profile has %d names after explain, want 0", n)
	}
}

func TestTargetErrors(t *testing.T) {
	for _, s := range []string{"", "ftp://example.com/", "https://user:pw@example.com/", "example.com/path", "[::1", "example.com:99999", "a b", "exa_mple..com"} {
		if _, err := Explain(Policy{}, "", s); !errors.Is(err, ErrTarget) {
			t.Errorf("Explain(%q) error = %v, want ErrTarget", s, err)
		}
	}
}

// TestExplainPush: a host with push rules says so, and whether a request
// is a push the proxy would hold (the proxy's own test, gitpush.Held).
func TestExplainPush(t *testing.T) {
	l := list(t, "code.test\ncode.test push refs/heads/agent/*\nopen.test\n")
	p := Policy{List: l, Mode: policy.Active}
	for _, tt := range []struct {
		method, target string
		held           bool
	}{
		{"POST", "https://code.test/app.git/git-receive-pack", true},
		{"PUT", "https://code.test/app.git/git%2Dreceive-pack?x=1", true},
		{"GET", "https://code.test/app.git/info/refs?service=git-receive-pack", false},
		{"POST", "https://code.test/app.git/git-upload-pack", false},
	} {
		r, err := Explain(p, tt.method, tt.target)
		if err != nil {
			t.Fatal(err)
		}
		if r.Push == nil || r.Push.Held != tt.held || r.Push.Rules != "refs/heads/agent/*" || r.Push.Set != "code.test" {
			t.Errorf("%s %s: push %+v, want held %v under refs/heads/agent/*", tt.method, tt.target, r.Push, tt.held)
		}
	}
	if r, _ := Explain(p, "", "code.test"); r.Push == nil || r.Push.Held || !strings.Contains(r.Push.Note, "held") {
		t.Errorf("a bare name with push rules: %+v", r.Push)
	}
	if r, _ := Explain(p, "POST", "https://open.test/app.git/git-receive-pack"); r.Push != nil {
		t.Errorf("a host without push rules: %+v", r.Push)
	}
}
