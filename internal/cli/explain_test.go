package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/explain"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/validate"
)

func saveState(t *testing.T, root string, s instance.State) {
	t.Helper()
	// Load validates the state like user input: fill in what the test
	// does not care about as create would.
	s.UUID, s.MAC, s.Accel, s.CPUs, s.MemoryMiB, s.ProxyPort = "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50", "52:54:00:ab:cd:ef", "tcg", 1, 1024, instance.DefaultProxyPort
	s.Subnet = netip.PrefixFrom(s.Gateway, 24).Masked()
	s.GuestIP = s.Subnet.Addr().Next().Next()
	br, err := validate.BridgeName(s.Name)
	if err != nil {
		t.Fatal(err)
	}
	s.Bridge = br
	os.MkdirAll(paths.Layout{Root: root}.InstanceDir(s.Name), 0o755)
	if err := instance.Save(paths.Layout{Root: root}, s); err != nil {
		t.Fatal(err)
	}
}

func TestExplainCommandLive(t *testing.T) {
	run, eng := controlRig(t)
	root := filepath.Dir(filepath.Dir(filepath.Dir(eng.Path())))
	saveState(t, root, instance.State{Name: "dev", Gateway: netip.MustParseAddr("10.10.9.1"), Ports: []uint16{443}})
	if _, err := eng.Add("*.example.org"); err != nil {
		t.Fatal(err)
	}
	out, _, err := run("explain", "dev", "https://api.example.org/v1")
	if err != nil || !strings.Contains(out, "rule *.example.org") || !strings.Contains(out, "ALLOW") || !strings.Contains(out, "running filters") {
		t.Fatalf("explain allowed = %v\n%s", err, out)
	}
	// Port 80 is not among this instance's ports.
	out, _, err = run("explain", "dev", "http://api.example.org/")
	var ce exitCodeError
	if !errors.As(err, &ce) || ce.code != exitBlocked || !strings.Contains(out, "port_not_allowed") {
		t.Fatalf("explain port 80 = %v\n%s", err, out)
	}
	// The live mode counts, and explain records nothing in the profile.
	eng.SetMode(policy.Passive)
	out, _, err = run("explain", "--json", "dev", "unlisted.test")
	var r explain.Result
	if err != nil || json.Unmarshal([]byte(out), &r) != nil || r.Proxy.Reason != policy.ReasonPassive {
		t.Fatalf("explain passive = %v\n%s", err, out)
	}
	if n := len(eng.Profile().Entries); n != 0 {
		t.Errorf("explain recorded %d names in the passive profile", n)
	}
	// A literal of the gateway is the host's address.
	out, _, err = run("explain", "dev", "10.10.9.1:443")
	if !errors.As(err, &ce) || !strings.Contains(out, "host_address") && !strings.Contains(out, "private") {
		t.Fatalf("explain gateway = %v\n%s", err, out)
	}
	if _, _, err := run("explain", "dev", "ftp://x.test/"); err == nil || !strings.Contains(err.Error(), "scheme") {
		t.Errorf("explain ftp = %v", err)
	}
}

func TestExplainCommandFiltersDown(t *testing.T) {
	root := t.TempDir()
	l := paths.Layout{Root: root}
	saveState(t, root, instance.State{Name: "off", Gateway: netip.MustParseAddr("10.10.8.1")})
	os.WriteFile(l.Allowlist("off"), []byte("example.com\n"), 0o644)
	out, err := runCLI(l, "explain", "off", "example.com")
	if err != nil || !strings.Contains(out, "allowlist file") || !strings.Contains(out, "ALLOW") {
		t.Fatalf("explain with filters down = %v\n%s", err, out)
	}
	if _, err := runCLI(l, "explain", "nosuch", "example.com"); !errors.Is(err, instance.ErrNotFound) {
		t.Errorf("explain on a missing instance = %v", err)
	}
}

// runCLI runs one command against the data root of l.
func runCLI(l paths.Layout, args ...string) (string, error) {
	var out, errb strings.Builder
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb, layout: func() (paths.Layout, error) { return l, nil }}
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.ExecuteContext(context.Background())
	return out.String() + errb.String(), err
}

// TestExplainCommandRequestRules: METHOD URL is decided by the host's
// rules, as the proxy decides it.
func TestExplainCommandRequestRules(t *testing.T) {
	root := t.TempDir()
	l := paths.Layout{Root: root}
	saveState(t, root, instance.State{Name: "off", Gateway: netip.MustParseAddr("10.10.8.1")})
	os.WriteFile(l.Allowlist("off"), []byte("api.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls\n"), 0o644)
	out, err := runCLI(l, "explain", "off", "POST", "https://api.github.com/repos/acme/app/pulls")
	if err != nil || !strings.Contains(out, "POST allowed by api.github.com's rule") || !strings.Contains(out, "sent upstream as /repos/acme/app/pulls") {
		t.Fatalf("allowed POST = %v\n%s", err, out)
	}
	out, err = runCLI(l, "explain", "off", "POST", "https://api.github.com/gists")
	var ce exitCodeError
	if !errors.As(err, &ce) || ce.code != exitBlocked || !strings.Contains(out, "path_not_allowed") || !strings.Contains(out, "rules of api.github.com") {
		t.Fatalf("refused POST = %v\n%s", err, out)
	}
	out, err = runCLI(l, "explain", "off", "https://api.github.com/a/%2e%2e/b")
	if err != nil || !strings.Contains(out, "sent upstream as /b") {
		t.Fatalf("default GET = %v\n%s", err, out)
	}
	if _, err := runCLI(l, "explain", "off", "post", "https://api.github.com/"); err == nil || !strings.Contains(err.Error(), "write POST") {
		t.Errorf("lower-case method = %v", err)
	}
	if _, err := runCLI(l, "explain", "off", "POST"); err == nil || !strings.Contains(err.Error(), "give the URL after it") {
		t.Errorf("a method without a target = %v", err)
	}
}

// TestExplainCommandLiveRules: with the filters running, explain decides
// by the rules in force, which the API reports line by line.
func TestExplainCommandLiveRules(t *testing.T) {
	run, eng := controlRig(t)
	root := filepath.Dir(filepath.Dir(filepath.Dir(eng.Path())))
	saveState(t, root, instance.State{Name: "dev", Gateway: netip.MustParseAddr("10.10.9.1"), Ports: []uint16{443}})
	if _, err := eng.Add("api.example.org GET,HEAD /**"); err != nil {
		t.Fatal(err)
	}
	out, _, err := run("explain", "dev", "DELETE", "https://api.example.org/v1/x")
	var ce exitCodeError
	if !errors.As(err, &ce) || ce.code != exitBlocked || !strings.Contains(out, "method_not_allowed") || !strings.Contains(out, "running filters") {
		t.Fatalf("live DELETE = %v\n%s", err, out)
	}
	if out, _, err := run("explain", "dev", "https://api.example.org/v1/x"); err != nil || !strings.Contains(out, "GET allowed by api.example.org's rule \"GET,HEAD /**\"") {
		t.Fatalf("live GET = %v\n%s", err, out)
	}
}
