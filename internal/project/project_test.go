package project

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

func loadProject(t *testing.T, yaml string, files map[string]string) *config.Project {
	t.Helper()
	dir := t.TempDir()
	files[config.FileName] = yaml
	for n, c := range files {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := config.Load(filepath.Join(dir, config.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// saveState writes st filled in as create would, so that Load (which
// validates) accepts it.
func saveState(t *testing.T, l paths.Layout, st instance.State) {
	t.Helper()
	st.UUID, st.MAC, st.Accel, st.User = "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50", "52:54:00:ab:cd:ef", "tcg", "abox"
	if st.MemoryMiB == 0 {
		st.MemoryMiB = 1024
	}
	st.ProxyPort = instance.DefaultProxyPort
	st.Gateway = netip.MustParseAddr("10.10.3.1")
	st.Subnet = netip.MustParsePrefix("10.10.3.0/24")
	st.GuestIP = netip.MustParseAddr("10.10.3.2")
	st.Bridge, _ = validate.BridgeName(st.Name)
	if err := os.MkdirAll(l.InstanceDir(st.Name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := instance.Save(l, st); err != nil {
		t.Fatal(err)
	}
}

func TestDrift(t *testing.T) {
	p := loadProject(t, "version: 1\nname: dev\ncpus: 4\nmemory: 2048\nports: [443, 80]\nallow_private: [10.20.0.0/16]\noverrides: {libvirt: {template: t.xml}}\n", map[string]string{"t.xml": "<domain/>"})
	st := instance.State{Name: "dev", Base: "debian-12", CPUs: 2, MemoryMiB: 2048, DiskGiB: 10, Accel: "tcg",
		AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16")}, Template: "<domain/>"}
	got, err := drift(p, st)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (Drift{Key: "cpus", File: "4", Instance: "2"}) {
		t.Errorf("drift = %+v, want only cpus (ports in another order and accel auto are no drift)", got)
	}
	st.Template = "<domain type='kvm'/>"
	st.NoMITM = true
	st.Ports = []uint16{80, 443, 8443}
	st.Monitor = true
	got, _ = drift(p, st)
	var keys []string
	for _, d := range got {
		keys = append(keys, d.Key)
	}
	if strings.Join(keys, " ") != "cpus monitor.enabled ports mitm.enabled overrides.libvirt.template" {
		t.Errorf("drift keys = %q", keys)
	}
}

func TestBlockedNamesTheFix(t *testing.T) {
	for _, tc := range []struct {
		comp string
		d    decision
		want Blocked
	}{
		{"dns", decision{Verdict: "block", Reason: "not_allowlisted", Name: "pypi.org"}, Blocked{"dns", "pypi.org", "not_allowlisted", "allowlist: [pypi.org]"}},
		{"http", decision{Verdict: "block", Reason: "not_allowlisted", Host: "files.pythonhosted.org", Port: 443}, Blocked{"http", "files.pythonhosted.org:443", "not_allowlisted", "allowlist: [files.pythonhosted.org]"}},
		{"http", decision{Verdict: "block", Reason: "port_not_allowed", Host: "git.example.com", Port: 9418}, Blocked{"http", "git.example.com:9418", "port_not_allowed", "ports: [9418]"}},
		{"http", decision{Verdict: "block", Reason: "private", Host: "10.0.0.5", Port: 80}, Blocked{"http", "10.0.0.5:80", "private", ""}},
		{"http", decision{Verdict: "block", Reason: "method_not_allowed", Host: "api.github.com", Port: 443, Method: "POST", Path: "/repos/acme/app/./pulls?x=1"}, Blocked{"http", "api.github.com:443", "method_not_allowed", `the rule "POST /repos/acme/app/pulls" to the allowlist entry that decides api.github.com (abox explain api.github.com tells which)`}},
		{"http", decision{Verdict: "block", Reason: "path_not_allowed", Host: "api.github.com", Port: 443, Method: "GET", Path: "/a\x1b[2J"}, Blocked{"http", "api.github.com:443", "path_not_allowed", ""}},
		{"http", decision{Verdict: "block", Reason: "method_not_allowed", Host: "api.github.com", Port: 443, Method: "GET\x1b[2J", Path: "/a"}, Blocked{"http", "api.github.com:443", "method_not_allowed", ""}},
		// The guest names what it asks for; up prints it on the terminal.
		{"http", decision{Verdict: "block", Reason: "invalid_name", Host: "x\x1b]0;pwned\x07\u202e", Port: 443}, Blocked{"http", `x\x1b]0;pwned\x07\u202e:443`, "invalid_name", ""}},
		{"dns", decision{Verdict: "block", Reason: "not_allowlisted\x1b[2K", Name: "a\rb"}, Blocked{"dns", `a\rb`, `not_allowlisted\x1b[2K`, ""}},
	} {
		if got := blockedOf(tc.comp, tc.d); got != tc.want {
			t.Errorf("blockedOf(%s, %+v) = %+v, want %+v", tc.comp, tc.d, got, tc.want)
		}
	}
}

// TestUpAndDownNeverTakeOverAnotherInstance: a repository's abox.yaml that
// names an existing instance (made by hand, or from another file) must not
// reconfigure, stop or delete it.
func TestUpAndDownNeverTakeOverAnotherInstance(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	saveState(t, l, instance.State{Name: "prod", Base: "debian-12", CPUs: 2})
	p := loadProject(t, "version: 1\nname: prod\n", map[string]string{})
	d := Deps{Layout: l, Manager: &instance.Manager{Layout: l}, Trust: config.TrustStore{Dir: filepath.Join(l.Root, "trust")}, Out: io.Discard, Progress: io.Discard}
	if _, err := Up(context.Background(), d, p, UpOptions{}); !errors.Is(err, ErrNotThisProject) {
		t.Errorf("up on a hand-made instance: %v", err)
	}
	if err := Down(context.Background(), d.Manager, p, true, instance.StopOptions{}); !errors.Is(err, ErrNotThisProject) {
		t.Errorf("down --rm on a hand-made instance: %v", err)
	}
	if err := saveBinding(l, "prod", binding{File: "/elsewhere/abox.yaml"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Up(context.Background(), d, p, UpOptions{}); !errors.Is(err, ErrNotThisProject) || !strings.Contains(err.Error(), "/elsewhere/abox.yaml") {
		t.Errorf("up on another file's instance: %v", err)
	}
	if _, err := instance.Load(l, "prod"); err != nil {
		t.Errorf("the instance is gone: %v", err)
	}
}

// TestBindingIsPrivate: project.json is 0600 like every file of the
// instance directory, also when it replaces one an older abox wrote 0644.
func TestBindingIsPrivate(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	saveState(t, l, instance.State{Name: "dev", Base: "debian-12", CPUs: 2})
	file := filepath.Join(l.InstanceDir("dev"), bindingFile)
	for _, old := range []bool{false, true} {
		if old {
			if err := os.WriteFile(file, []byte("{}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Chmod(file, 0o644)
		}
		if err := saveBinding(l, "dev", binding{File: "/src/abox.yaml"}); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != instance.PrivateFile {
			t.Fatalf("project.json (over an old one: %v) is %v, %v; want 0600", old, fi.Mode().Perm(), err)
		}
	}
}

// TestUpRefusesBeforeMakingAnything: an untrusted widening file and a
// setting this abox cannot honour fail before any instance exists.
func TestUpRefusesBeforeMakingAnything(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	d := Deps{Layout: l, Manager: &instance.Manager{Layout: l}, Trust: config.TrustStore{Dir: filepath.Join(l.Root, "trust")}, Out: io.Discard, Progress: io.Discard}
	for _, tc := range []struct{ yaml, want string }{
		{"version: 1\nname: dev\nallow_private: [10.0.0.0/8]\n", "not trusted"},
		{"version: 1\nname: dev\nallowlist: [exfil.example.net]\n", "allowlist: lets the guest reach 1 name(s): exfil.example.net"},
		{"version: 1\nname: dev\nmitm: {enabled: false}\n", "mitm.enabled: turns TLS interception off"},
		{"version: 1\nname: dev\nprovision: {overlay: .}\n", "provision.overlay: copies the whole project directory into the guest"},
		{"version: 1\nname: dev\nmonitor: {enabled: true}\n", "monitor.enabled: adds a channel from the guest"},
		{"version: 1\nname: dev\nbase: other-image\n", "base: boots the guest from the installed image other-image"},
	} {
		p := loadProject(t, tc.yaml, map[string]string{})
		_, err := Up(context.Background(), d, p, UpOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.want)
		}
		if entries, _ := os.ReadDir(l.Instances()); len(entries) != 0 {
			t.Errorf("%q left %d instance directories", tc.yaml, len(entries))
		}
	}
}
