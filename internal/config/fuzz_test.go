package config

import (
	"bytes"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/termtext"
)

// FuzzParse: abox.yaml is a hostile repository's file. Whatever its bytes,
// reading and validating it either fails with a message that carries no
// terminal control, or gives a configuration that
//
//   - names only paths inside the project (local, already clean);
//   - stays within the resource bounds;
//   - holds allowlist entries in their normal form (each parses back to
//     itself), and MITM exceptions that are host names;
//   - widens nothing the trust prompt does not list: a file without
//     widenings is as narrow as the defaults (the allowlist file's entries
//     are counted by Project.Widenings, which reads it);
//   - is the same when read again.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"version: 1\nname: dev\n",
		"version: 1\nname: dev\nallowlist: [api.example.com, \"*.example.org\"]\nports: [80, 443, 8443]\nmode: passive\n",
		"version: 1\nname: dev\nmitm: {enabled: false, exceptions: [pinned.example.com]}\ndns: {upstreams: [9.9.9.9, \"1.1.1.1:53\"]}\n",
		"version: 1\nname: dev\nupstream_proxy: {url: \"http://proxy:3128\", credentials_file: ~/p}\nupstream_ca: certs/ca.pem\n",
		"version: 1\nname: dev\nallow_private: [10.20.0.0/16, 192.168.1.7]\nforwards: [\"8080:80\"]\n",
		"version: 1\nname: dev\noverrides: {libvirt: {template: domain.xml}}\nprovision: {overlay: o, scripts: [a.sh, b/../c.sh]}\nmonitor: {bundle: release}\n",
		"version: 1\nname: dev\ncpus: 64\nmemory: 262144\ndisk: 2048\naccel: kvm\nbase: debian-12\nallowlist_file: allow.txt\n",
		"version: 1\nname: dev\ncpus: !!float \"\\e[8m\"\n",
		"version: !!int \"\\e[2J\"\n",
		"version: 1\nname: dev\nmonitor: {enabled: !!bool \"\\e]0;x\\a\"}\n",
		"version: 1\nname: &a dev\nbase: *a\n",
		"version: 1\nname: dev\n---\nversion: 1\n",
		"version: 1\nname: dev\nallowlist: [\"a.example.com\\e[8m\"]\nprovision: {scripts: [\"../x\"]}\n",
		"version: 1\nname: dev\nallowlist:\n  - \"github.com GET /*/*/info/refs?service=git-upload-pack\"\n  - host: api.github.com\n    rules: [\"GET,HEAD /**\", \"POST /repos/acme/app/pulls audit\"]\n    audit: true\n",
		"version: 1\nname: dev\nallowlist: [{host: a.example.com, rules: []}, {}, [x], a.example.com]\nmitm: {exceptions: [a.example.com]}\n",
		"version: 1\nname: dev\nsecrets:\n  - {name: API_KEY, host: api.example.com, bearer: true, rules: [\"POST /v1/**\"]}\n  - {name: B, host: \"*.example.org:8443\", basic: x-access-token}\n  - {name: C, host: c.example.com, header: x-api-key}\n",
		"version: 1\nname: dev\nsecrets: {API_KEY: sk-abcdef0123456789}\n",
		"version: 1\nname: dev\nsecrets: [{name: A, host: a.example.com, value: x}, {name: A, host: a.example.com, bearer: true}]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseBytes(b)
		if err != nil {
			for _, l := range strings.Split(err.Error(), "\n") {
				if termtext.Check(l) != nil {
					t.Fatalf("the error for %q carries a terminal control: %q", b, err)
				}
			}
			return
		}
		for _, p := range append([]string{c.AllowlistFile, c.UpstreamCA, c.Template, c.Overlay, strings.TrimPrefix(c.MonitorBundle, "release")}, c.Scripts...) {
			if p != "" && (!filepath.IsLocal(p) || filepath.Clean(p) != p) {
				t.Fatalf("%q: the path %q is not a clean path inside the project", b, p)
			}
		}
		if c.CPUs < 1 || c.CPUs > MaxCPUs || c.MemoryMiB < 256 || c.MemoryMiB > MaxMemoryMiB || c.DiskGiB < 1 || c.DiskGiB > MaxDiskGiB {
			t.Fatalf("%q: resources out of bounds: %d CPUs, %d MiB, %d GiB", b, c.CPUs, c.MemoryMiB, c.DiskGiB)
		}
		for _, ln := range c.Allowlist {
			again, err := allowlist.ParseLine(ln.String())
			if err != nil || again.String() != ln.String() {
				t.Fatalf("%q: the line %q parses back as %q, %v", b, ln, again, err)
			}
		}
		for _, h := range c.MITMExceptions {
			if e, err := allowlist.ParseEntry(h); err != nil || e.Wildcard || e.Name != h {
				t.Fatalf("%q: the MITM exception %q is not a host name in normal form", b, h)
			}
		}
		// A binding is one abox secret bind would make for the instance.
		for _, sec := range c.Secrets {
			sb := sec.Binding
			spec := secrets.BindingSpec{Instance: c.Name, Host: sb.Host + ":" + strconv.Itoa(int(sb.Port)), Rules: sb.Rules, Bearer: sb.Send == secrets.SendBearer, Basic: sb.User}
			if sb.Send == secrets.SendHeader {
				spec.Header = sb.Header
			}
			again, err := secrets.ParseBinding(spec)
			if secrets.CheckName(sec.Name) != nil || sb.Instance != c.Name || err != nil || !reflect.DeepEqual(again, sb) {
				t.Fatalf("%q: secret %s's binding %+v is not what abox secret bind makes (%+v, %v)", b, sec.Name, sb, again, err)
			}
		}
		for _, p := range c.Ports {
			if p == 0 {
				t.Fatalf("%q: port 0", b)
			}
		}
		if len(c.Widenings()) == 0 {
			wide := len(c.Allowlist) > 0 || len(c.AllowPrivate) > 0 || c.Passive || c.NoMITM ||
				len(c.MITMExceptions) > 0 || len(c.Upstreams) > 0 || c.UpstreamProxy != nil || c.UpstreamCA != "" || c.Template != "" ||
				len(c.Forwards) > 0 || len(c.Secrets) > 0 || c.CPUs > DefaultCPUs || c.MemoryMiB > DefaultMemoryMiB || c.DiskGiB > DefaultDiskGiB
			for _, p := range c.Ports {
				wide = wide || p != 80 && p != 443
			}
			if wide {
				t.Fatalf("%q widens the sandbox without a widening listed for trust: %+v", b, c)
			}
		}
		again, err := parseBytes(b)
		if err != nil || !reflect.DeepEqual(again, c) {
			t.Fatalf("%q reads differently the second time: %+v, %v", b, again, err)
		}
	})
}

func parseBytes(b []byte) (Config, error) {
	d, err := Parse(bytes.NewReader(b), "abox.yaml")
	if err != nil {
		return Config{}, err
	}
	return d.Validate()
}
