package config

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/termtext"
)

func parse(t *testing.T, src string) (Config, error) {
	t.Helper()
	d, err := Parse(strings.NewReader(src), "abox.yaml")
	if err != nil {
		return Config{}, err
	}
	return d.Validate()
}

// TestEveryKey sets every key of version 1 and checks where it lands.
func TestEveryKey(t *testing.T) {
	src := `version: 1
name: dev
base: debian-12
cpus: 4
memory: 4096
disk: 20
accel: tcg
allowlist:
  - api.example.com
  - "*.registry.example.org"
  - api.example.com
allowlist_file: allow.txt
ports: [80, 443, 8443]
allow_private: [10.20.0.0/16, 192.168.1.7]
mode: passive
mitm:
  enabled: false
  exceptions: [pinned.example.com]
dns:
  upstreams: [9.9.9.9, "1.1.1.1:53"]
upstream_proxy:
  url: http://proxy.corp.example:3128
  credentials_file: ~/.config/abox/proxy
upstream_ca: certs/corp.pem
monitor:
  enabled: true
overrides:
  libvirt:
    template: domain.xml
provision:
  overlay: overlay
  scripts: [setup.sh, tools/agent.sh]
forwards: ["8080:80", "5173:5173"]
`
	c, err := parse(t, src)
	if err != nil {
		t.Fatal(err)
	}
	if c.Name != "dev" || c.Base != "debian-12" || c.CPUs != 4 || c.MemoryMiB != 4096 || c.DiskGiB != 20 || c.Accel != "tcg" {
		t.Errorf("resources: %+v", c)
	}
	var entries []string
	for _, e := range c.Allowlist {
		entries = append(entries, e.String())
	}
	if strings.Join(entries, " ") != "api.example.com *.registry.example.org" {
		t.Errorf("allowlist = %q (duplicates must go)", entries)
	}
	if c.AllowlistFile != "allow.txt" || !reflect.DeepEqual(c.Ports, []uint16{80, 443, 8443}) {
		t.Errorf("allowlist_file %q ports %v", c.AllowlistFile, c.Ports)
	}
	if !reflect.DeepEqual(c.AllowPrivate, []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("192.168.1.7/32")}) {
		t.Errorf("allow_private = %v", c.AllowPrivate)
	}
	if !c.Passive || !c.NoMITM || !reflect.DeepEqual(c.MITMExceptions, []string{"pinned.example.com"}) {
		t.Errorf("mode/mitm: %+v", c)
	}
	if !reflect.DeepEqual(c.Upstreams, []string{"9.9.9.9", "1.1.1.1:53"}) {
		t.Errorf("upstreams = %v", c.Upstreams)
	}
	if c.UpstreamProxy == nil || c.UpstreamProxy.Host != "proxy.corp.example:3128" || c.ProxyCredentials != "~/.config/abox/proxy" {
		t.Errorf("upstream proxy = %v %q", c.UpstreamProxy, c.ProxyCredentials)
	}
	if c.UpstreamCA != "certs/corp.pem" || !c.Monitor || c.Template != "domain.xml" {
		t.Errorf("ca/monitor/template: %+v", c)
	}
	if c.Overlay != "overlay" || !reflect.DeepEqual(c.Scripts, []string{"setup.sh", "tools/agent.sh"}) {
		t.Errorf("provision: %q %v", c.Overlay, c.Scripts)
	}
	if !reflect.DeepEqual(c.Forwards, []Forward{{8080, 80}, {5173, 5173}}) {
		t.Errorf("forwards = %v", c.Forwards)
	}
	var keys []string
	for _, w := range c.Widenings() {
		keys = append(keys, w.Key)
	}
	want := "allowlist cpus memory disk overrides.libvirt.template allow_private ports mode mitm.enabled mitm.exceptions dns.upstreams upstream_proxy.url upstream_ca monitor.enabled provision.overlay forwards"
	if strings.Join(keys, " ") != want {
		t.Errorf("widenings = %q, want %q", keys, want)
	}
}

// TestKeysThatReachMoreNeedTrust: an overlay copies the project's files
// (untracked ones, .git) into the guest, another base is any installed
// image, and the monitor adds a channel from the guest to the host.
func TestKeysThatReachMoreNeedTrust(t *testing.T) {
	for _, tc := range []struct{ src, key, why string }{
		{"provision: {overlay: .}", "provision.overlay", "the whole project directory into the guest, untracked files and .git included"},
		{"provision: {overlay: ./}", "provision.overlay", "the whole project directory"},
		{"provision: {overlay: setup}", "provision.overlay", "copies setup into the guest, untracked files in it too"},
		{"base: old-image", "base", "the installed image old-image instead of debian-12"},
		{"monitor: {enabled: true}", "monitor.enabled", "a channel from the guest to a host process"},
		{"monitor: {bundle: release}", "monitor.bundle", "a channel from the guest to a host process"},
	} {
		c, err := parse(t, "version: 1\nname: dev\n"+tc.src+"\n")
		if err != nil {
			t.Fatal(err)
		}
		if w := c.Widenings(); len(w) != 1 || w[0].Key != tc.key || !strings.Contains(w[0].Why, tc.why) {
			t.Errorf("%s: widenings %v, want %s: ...%s...", tc.src, w, tc.key, tc.why)
		}
	}
	// The default base and no monitor, restated, need none.
	if c, err := parse(t, "version: 1\nname: dev\nbase: debian-12\nmonitor: {enabled: false}\n"); err != nil || len(c.Widenings()) != 0 {
		t.Errorf("restated defaults: %v, %v", c.Widenings(), err)
	}
}

func TestDefaultsAreHardened(t *testing.T) {
	c, err := parse(t, "version: 1\nname: dev\n")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Name: "dev", Base: DefaultBase, CPUs: DefaultCPUs, MemoryMiB: DefaultMemoryMiB, DiskGiB: DefaultDiskGiB, Accel: "auto"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
	if w := c.Widenings(); len(w) != 0 {
		t.Errorf("defaults need trust: %v", w)
	}
	// Tightening or restating defaults needs no trust either.
	c, err = parse(t, "version: 1\nname: dev\nports: [443]\nmode: active\nmitm: {enabled: true}\nallowlist: []\nprovision: {scripts: [a.sh]}\n")
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Widenings(); len(w) != 0 {
		t.Errorf("tightening needs trust: %v", w)
	}
	// Smaller than the defaults needs none; more of the host's resources
	// does (a guest fills the disk it is given, on the host's).
	c, err = parse(t, "version: 1\nname: dev\ncpus: 1\nmemory: 512\ndisk: 5\n")
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Widenings(); len(w) != 0 {
		t.Errorf("smaller sizes need trust: %v", w)
	}
	c, err = parse(t, "version: 1\nname: dev\ndisk: 2048\n")
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Widenings(); len(w) != 1 || w[0].Key != "disk" || !strings.Contains(w[0].Why, "2048 GiB of the host's disk") {
		t.Errorf("a 2 TiB disk needs no trust: %v", w)
	}
	// The default allowlist is empty: every entry is somewhere the guest
	// could send what it holds.
	c, err = parse(t, "version: 1\nname: dev\nallowlist: [api.example.com]\n")
	if err != nil {
		t.Fatal(err)
	}
	if w := c.Widenings(); len(w) != 1 || w[0].Key != "allowlist" || !strings.Contains(w[0].Why, "api.example.com") {
		t.Errorf("an allowlist entry needs no trust: %v", w)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, want string
	}{
		{"unknown top-level key", "version: 1\nname: dev\nallowlsit: [a.example.com]\n", `abox.yaml:3:1: unknown key "allowlsit" (did you mean "allowlist"?)`},
		{"unknown nested key", "version: 1\nname: dev\nmitm:\n  enable: false\n", `abox.yaml:4:3: unknown key "mitm.enable" (did you mean "enabled"?)`},
		{"unknown key without a near one", "version: 1\nname: dev\nzzzzzzzz: 1\n", `unknown key "zzzzzzzz" (known here:`},
		{"deep unknown key", "version: 1\nname: dev\noverrides:\n  libvirt:\n    tempalte: x.xml\n", `abox.yaml:5:5: unknown key "overrides.libvirt.tempalte" (did you mean "template"?)`},
		{"string for an int", "version: 1\nname: dev\ncpus: four\n", `abox.yaml:3:7: cpus: want an integer, got the string "four"`},
		{"quoted int", "version: 1\nname: dev\nmemory: \"2048\"\n", `abox.yaml:3:9: memory: want an integer, got the string "2048"`},
		{"float for an int", "version: 1\nname: dev\ncpus: 1.5\n", `cpus: want an integer, got the number 1.5`},
		{"yes for a bool", "version: 1\nname: dev\nmonitor:\n  enabled: yes\n", `abox.yaml:4:12: monitor.enabled: want true or false, got the string "yes" (YAML 1.2`},
		{"scalar for a list", "version: 1\nname: dev\nallowlist: a.example.com\n", `abox.yaml:3:12: allowlist: want a list, got the string "a.example.com"`},
		{"list for a mapping", "version: 1\nname: dev\nmitm: [a]\n", `abox.yaml:3:7: mitm: want a mapping of keys (enabled, exceptions), got a list`},
		{"mapping in a list of strings", "version: 1\nname: dev\nports: [{a: 1}]\n", `ports[0]: want an integer, got a mapping`},
		{"no version", "name: dev\n", "no version; add `version: 1`"},
		{"version 2", "version: 2\nname: dev\n", "abox.yaml:1:10: version 2 is not supported by this abox (it reads version 1)"},
		{"version 0", "version: 0\nname: dev\n", "version 0 is not supported"},
		{"version as a string", "version: \"1\"\nname: dev\n", "version: want an integer"},
		{"empty file", "", "empty file"},
		{"comments only", "# nothing\n", "empty file"},
		{"two documents", "version: 1\nname: dev\n---\nversion: 1\n", "more than one YAML document"},
		{"top level list", "- a\n", "want a mapping of keys"},
		{"duplicate key", "version: 1\nname: dev\nname: other\n", `abox.yaml:3:1: "name" appears twice`},
		{"anchor", "version: 1\nname: dev\nallowlist: &a [a.example.com]\nmitm:\n  exceptions: *a\n", "anchors and aliases"},
		{"merge key", "version: 1\nname: dev\nmitm:\n  <<: {enabled: false}\n", "merge keys"},
		{"syntax error", "version: 1\nname: [dev\n", "abox.yaml"},
		{"no name", "version: 1\n", "name: required"},
		{"bad name", "version: 1\nname: ../etc\n", "abox.yaml:2:7: name: validating instance name"},
		{"cpus too many", "version: 1\nname: dev\ncpus: 100000\n", "abox.yaml:3:7: cpus: 100000 is out of range (1-64)"},
		{"negative disk", "version: 1\nname: dev\ndisk: -1\n", "disk: -1 is out of range"},
		{"memory in GiB by mistake", "version: 1\nname: dev\nmemory: 4\n", "memory is in MiB"},
		{"monitor bundle outside", "version: 1\nname: dev\nmonitor:\n  bundle: /var/cache/t.tar.gz\n", "monitor.bundle: \"/var/cache/t.tar.gz\" must be a relative path inside the project"},
		{"monitor bundle above", "version: 1\nname: dev\nmonitor:\n  bundle: ../t.tar.gz\n", "monitor.bundle: \"../t.tar.gz\" must be a relative path"},
		{"accel", "version: 1\nname: dev\naccel: hvf\n", `accel: "hvf": want kvm, tcg or auto`},
		{"wide allowlist entry", "version: 1\nname: dev\nallowlist: ['*']\n", `abox.yaml:3:13: allowlist[0]: "*" would allow everything`},
		{"public suffix wildcard", "version: 1\nname: dev\nallowlist: ['a.example.com', '*.co.uk']\n", "allowlist[1]:"},
		{"port 0", "version: 1\nname: dev\nports: [0]\n", "ports[0]: 0 is not a port"},
		{"port too big", "version: 1\nname: dev\nports: [70000]\n", "ports[0]: 70000 is not a port"},
		{"bad cidr", "version: 1\nname: dev\nallow_private: [10.0.0.0/33]\n", "allow_private[0]:"},
		{"mode", "version: 1\nname: dev\nmode: open\n", `mode: "open": want active or passive`},
		{"mitm exception wildcard", "version: 1\nname: dev\nmitm: {exceptions: ['*.example.com']}\n", "mitm.exceptions[0]"},
		{"dns upstream name", "version: 1\nname: dev\ndns: {upstreams: [dns.google]}\n", "dns.upstreams[0]"},
		{"proxy with credentials", "version: 1\nname: dev\nupstream_proxy: {url: 'http://u:p@proxy:3128'}\n", "credentials do not belong in the URL"},
		{"proxy scheme", "version: 1\nname: dev\nupstream_proxy: {url: 'socks5://proxy:1080'}\n", "want http://HOST:PORT"},
		{"proxy without port", "version: 1\nname: dev\nupstream_proxy: {url: 'http://proxy'}\n", "want http://HOST:PORT"},
		{"credentials without proxy", "version: 1\nname: dev\nupstream_proxy: {credentials_file: x}\n", "set without upstream_proxy.url"},
		{"absolute script", "version: 1\nname: dev\nprovision: {scripts: [/etc/shadow]}\n", `provision.scripts[0]: "/etc/shadow" must be a relative path inside the project`},
		{"traversing script", "version: 1\nname: dev\nprovision: {scripts: [../../x.sh]}\n", "provision.scripts[0]:"},
		{"traversing overlay", "version: 1\nname: dev\nprovision: {overlay: a/../../b}\n", "provision.overlay:"},
		{"absolute template", "version: 1\nname: dev\noverrides: {libvirt: {template: /tmp/t.xml}}\n", "overrides.libvirt.template:"},
		{"traversing allowlist file", "version: 1\nname: dev\nallowlist_file: ../allow.txt\n", "allowlist_file:"},
		{"traversing ca", "version: 1\nname: dev\nupstream_ca: ../../ca.pem\n", "upstream_ca:"},
		{"reverse forward", "version: 1\nname: dev\nforwards: ['R:9000:9000']\n", "reverse forwards cannot be declared"},
		{"forward twice", "version: 1\nname: dev\nforwards: ['8080:80', '8080:81']\n", "forwards[1]: host port 8080 is forwarded twice"},
		{"forward no colon", "version: 1\nname: dev\nforwards: ['8080']\n", "forwards[0]:"},
		{"forward from a privileged host port", "version: 1\nname: dev\nforwards: ['22:22']\n", "forwards[0]: host port 22 is a privileged port"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestYAMLBombIsRefused: anchors are refused before anything expands them.
func TestYAMLBombIsRefused(t *testing.T) {
	var b strings.Builder
	b.WriteString("version: 1\nname: dev\nallowlist: [&a0 [a.example.com, a.example.com]")
	for i := 1; i < 30; i++ {
		fmt.Fprintf(&b, ", &a%d [*a%d, *a%d]", i, i-1, i-1)
	}
	b.WriteString("]\n")
	if _, err := parse(t, b.String()); err == nil || !strings.Contains(err.Error(), "abox.yaml:3:13: allowlist[0]: anchors and aliases") {
		t.Fatalf("billion laughs: %v", err)
	}
	if _, err := Parse(strings.NewReader(strings.Repeat("#", MaxFileBytes+1)), "abox.yaml"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("huge file: %v", err)
	}
}

func project(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, FileName)
}

// TestProjectFilesStayInside: a named file that is a symlink out of the
// project, a directory, or missing is refused at load, before up makes
// anything.
func TestProjectFilesStayInside(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("HOST SECRET"), 0o600)
	for _, tc := range []struct {
		name  string
		yaml  string
		setup func(dir string)
		want  string
	}{
		{"symlinked script", "provision: {scripts: [s.sh]}", func(d string) { os.Symlink(outside, filepath.Join(d, "s.sh")) }, "provision.scripts[0]"},
		{"symlinked allowlist", "allowlist_file: a.txt", func(d string) { os.Symlink(outside, filepath.Join(d, "a.txt")) }, "allowlist_file"},
		{"symlinked dir in path", "upstream_ca: certs/ca.pem", func(d string) { os.Symlink(filepath.Dir(outside), filepath.Join(d, "certs")) }, "upstream_ca"},
		{"symlinked overlay", "provision: {overlay: ov}", func(d string) { os.Symlink(filepath.Dir(outside), filepath.Join(d, "ov")) }, "provision.overlay"},
		{"missing template", "overrides: {libvirt: {template: t.xml}}", func(string) {}, "overrides.libvirt.template"},
		{"directory as script", "provision: {scripts: [d]}", func(d string) { os.Mkdir(filepath.Join(d, "d"), 0o755) }, "not a regular file"},
		{"fifo as allowlist", "allowlist_file: p", func(d string) { mkfifo(filepath.Join(d, "p")) }, "not a regular file"},
		{"symlinked monitor bundle", "monitor: {bundle: t.tar.gz}", func(d string) { os.Symlink(outside, filepath.Join(d, "t.tar.gz")) }, "monitor.bundle"},
		{"missing monitor bundle", "monitor: {bundle: t.tar.gz}", func(string) {}, "monitor.bundle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := project(t, map[string]string{FileName: "version: 1\nname: dev\n" + tc.yaml + "\n"})
			tc.setup(filepath.Dir(path))
			p, err := Load(path)
			if err == nil {
				p.Close()
				t.Fatal("loaded")
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "HOST SECRET") {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestTrust: a widening file is refused until trusted; any change to it or
// to the template it names asks again; a file that only tightens needs none.
func TestTrust(t *testing.T) {
	store := TrustStore{Dir: filepath.Join(t.TempDir(), "trust")}
	path := project(t, map[string]string{
		FileName: "version: 1\nname: dev\nallow_private: [10.20.0.0/16]\noverrides: {libvirt: {template: t.xml}}\n",
		"t.xml":  "<domain/>",
	})
	load := func() *Project {
		p, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	p := load()
	err := store.Check(p)
	var ue *UntrustedError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUntrusted) || len(ue.Widenings) != 2 {
		t.Fatalf("untrusted file: %v", err)
	}
	if !strings.Contains(err.Error(), "allow_private: lets the guest reach private addresses 10.20.0.0/16") {
		t.Errorf("message: %v", err)
	}
	if err := store.Trust(p); err != nil {
		t.Fatal(err)
	}
	if err := store.Check(load()); err != nil {
		t.Fatalf("after trust: %v", err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(path), "t.xml"), []byte("<domain type='kvm'/>"), 0o644)
	if err := store.Check(load()); !errors.Is(err, ErrUntrusted) {
		t.Errorf("changed template still trusted: %v", err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(path), "t.xml"), []byte("<domain/>"), 0o644)
	if err := store.Check(load()); err != nil {
		t.Errorf("restored template: %v", err)
	}
	os.WriteFile(path, []byte("version: 1\nname: dev\nallow_private: [10.20.0.0/16, 10.30.0.0/16]\noverrides: {libvirt: {template: t.xml}}\n"), 0o644)
	if err := store.Check(load()); !errors.Is(err, ErrUntrusted) {
		t.Errorf("changed file still trusted: %v", err)
	}
	// The same bytes in another directory are another file.
	other := project(t, map[string]string{FileName: "version: 1\nname: dev\nallow_private: [10.20.0.0/16]\noverrides: {libvirt: {template: t.xml}}\n", "t.xml": "<domain/>"})
	op, err := Load(other)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	if err := store.Check(op); !errors.Is(err, ErrUntrusted) {
		t.Errorf("a copy elsewhere inherited trust: %v", err)
	}
	tight := project(t, map[string]string{FileName: "version: 1\nname: dev\nports: [443]\n"})
	tp, err := Load(tight)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	if err := store.Check(tp); err != nil {
		t.Errorf("a tightening file needs trust: %v", err)
	}
}

// TestValuesArePrintable: no value of abox.yaml may carry what a terminal
// acts on; the trust prompt prints paths, and an escape sequence in one
// could erase the lines above it that list what the file widens.
func TestValuesArePrintable(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"escape in a path", `overrides: {libvirt: {template: "t\e[1A\e[2K.xml"}}`, "overrides.libvirt.template: \"t\\x1b[1A\\x1b[2K.xml\": it holds the control character U+001B"},
		{"OSC in a script name", `provision: {scripts: ["s\e]52;c;eA==\a.sh"]}`, "provision.scripts[0]"},
		{"bidi override", "allowlist_file: \"a\u202etxt.sh\"", "U+202E"},
		{"C1 control", `upstream_ca: "ca\u009b1A.pem"`, "U+009B"},
		{"carriage return", `upstream_proxy: {url: "http://p:3128", credentials_file: "c\rports: none"}`, "U+000D"},
		{"newline in a block scalar", "base: |\n  debian-12\n  x\n", "U+000A"},
		{"in a list", `allowlist: ["a.example.com\e[8m"]`, "allowlist[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, "version: 1\nname: dev\n"+tc.yaml+"\n")
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "printable text") {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
			for _, r := range err.Error() {
				if r == 0x1b || r == 0x9b || r == '\r' || r == 0x202e || r == 0x07 {
					t.Errorf("the error itself carries %U: %q", r, err)
				}
			}
		})
	}
}

// TestFIFOAsTheFileIsRefused: an abox.yaml that is a named pipe is refused
// at once instead of blocking `abox up` forever.
func TestFIFOAsTheFileIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	mkfifo(path)
	done := make(chan error, 1)
	go func() {
		p, err := Load(path)
		if err == nil {
			p.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("err = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Load blocked on a FIFO")
	}
}

// TestTrustCoversTheAllowlistAndWhatIsUsed: the allowlist file's content is
// part of what is trusted, and a trusted file's content is read once: what
// up uses is what was hashed, however the files change after Load (a
// checkout under way, a directory a guest can write).
func TestTrustCoversTheAllowlistAndWhatIsUsed(t *testing.T) {
	store := TrustStore{Dir: filepath.Join(t.TempDir(), "trust")}
	path := project(t, map[string]string{
		FileName:    "version: 1\nname: dev\nallowlist_file: allow.txt\noverrides: {libvirt: {template: t.xml}}\n",
		"allow.txt": "api.example.com\n",
		"t.xml":     "<domain/>",
	})
	dir := filepath.Dir(path)
	p, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := store.Check(p); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "allowlist: lets the guest reach 1 name(s): api.example.com") {
		t.Fatalf("an allowlist file needs no trust: %v", err)
	}
	if err := store.Trust(p); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "allow.txt"), []byte("api.example.com\nexfil.example.net\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "t.xml"), []byte("<domain type='kvm'><devices><filesystem/></devices></domain>"), 0o644)
	if err := store.Check(p); err != nil {
		t.Errorf("the loaded content lost its trust: %v", err)
	}
	if got := p.MergedAllowlist(); !reflect.DeepEqual(got, []string{"api.example.com"}) {
		t.Errorf("allowlist used = %v, want what was trusted", got)
	}
	if b, err := p.ReadFile("overrides.libvirt.template", "t.xml"); err != nil || string(b) != "<domain/>" {
		t.Errorf("template used = %q, %v; want what was trusted", b, err)
	}
	os.WriteFile(filepath.Join(dir, "t.xml"), []byte("<domain/>"), 0o644)
	q, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if err := store.Check(q); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "exfil.example.net") {
		t.Errorf("a changed allowlist file is still trusted: %v", err)
	}
}

// TestAllowPrivateParsesAsTheFlagDoes: abox.yaml's allow_private is read by
// the same rules as --allow-private: a /0 is no way to turn the filters
// off, an IPv4-mapped range is its IPv4 one, and a range wider than a site
// is named as such in the trust prompt.
func TestAllowPrivateParsesAsTheFlagDoes(t *testing.T) {
	for _, s := range []string{"0.0.0.0/0", "::/0", "::ffff:0.0.0.0/96", "fe80::1%eth0"} {
		if _, err := parse(t, "version: 1\nname: dev\nallow_private: [\""+s+"\"]\n"); err == nil {
			t.Errorf("allow_private %s accepted", s)
		}
	}
	c, err := parse(t, "version: 1\nname: dev\nallow_private: [\"::ffff:10.0.0.0/104\", 10.20.0.7]\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.AllowPrivate); got != "[10.0.0.0/8 10.20.0.7/32]" {
		t.Errorf("allow_private = %s", got)
	}
	w := c.Widenings()
	if len(w) != 1 || !strings.Contains(w[0].Why, "10.0.0.0/8 is wider than a /16") {
		t.Errorf("widenings = %v, want the wide range named", w)
	}
}

// TestMonitorBundleKey: monitor.bundle turns the monitor on, as a file
// inside the project or the word release.
func TestMonitorBundleKey(t *testing.T) {
	for src, want := range map[string]string{"release": "release", "agents/t.tar.gz": "agents/t.tar.gz", "./t.tar.gz": "t.tar.gz"} {
		c, err := parse(t, "version: 1\nname: dev\nmonitor:\n  bundle: "+src+"\n")
		if err != nil || !c.Monitor || c.MonitorBundle != want {
			t.Errorf("bundle %q: %+v %v", src, c.MonitorBundle, err)
		}
	}
}

// TestErrorsArePrintable: the file reaches an error's text in other ways
// than as a string value (an explicit tag on a value of another type,
// yaml.v3's own messages): whatever the way, no terminal control reaches
// the operator.
func TestErrorsArePrintable(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"float tag on an integer", `cpus: !!float "\e[8m"`, `cpus: want an integer, got the number \x1b[8m`},
		{"int tag that does not decode", `cpus: !!int "\e[2J"`, "cannot decode !!str `\\x1b[2J` as a !!int"},
		{"bool tag that does not decode", `monitor: {enabled: !!bool "\e]0;x\a"}`, "as a !!bool"},
		{"version", `version: !!int "\e[2J"`, `version \x1b[2J is not supported`},
		{"tag of a list", `ports: !!seq` + "\n  - !!int \"\\u202e1\"", `cannot decode`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "version: 1\nname: dev\n" + tc.yaml + "\n"
			if strings.HasPrefix(tc.yaml, "version:") {
				src = tc.yaml + "\nname: dev\n"
			}
			_, err := parse(t, src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %q, want it to hold %q", err, tc.want)
			}
			for _, l := range strings.Split(err.Error(), "\n") {
				if termtext.Check(l) != nil {
					t.Errorf("the error carries a terminal control: %q", err)
				}
			}
		})
	}
}
