package cloudinit

import (
	"bytes"
	"context"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/abox-dev/abox/internal/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run go test -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (if intended, run go test -update and review the diff)\n--- got:\n%s\n--- want:\n%s", name, got, want)
	}
}

// fixedKey is the authorized key GenerateSSHKey makes from an all-0x01 seed.
func fixedKey(t *testing.T) string {
	t.Helper()
	line, err := GenerateSSHKey(filepath.Join(t.TempDir(), "id"), "abox@dev", bytes.NewReader(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return line
}

func testConfig(t *testing.T) Config {
	t.Helper()
	ca, err := os.ReadFile("testdata/ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		Name:          "dev",
		UUID:          "4f1c2a7e-9b3d-4c5e-8f6a-0b1c2d3e4f50",
		User:          "abox",
		AuthorizedKey: fixedKey(t),
		CACertPEM:     string(ca),
		MAC:           "52:54:00:AB:cd:ef",
		Subnet:        netip.MustParsePrefix("10.10.5.0/24"),
		GuestIP:       netip.MustParseAddr("10.10.5.10"),
		Gateway:       netip.MustParseAddr("10.10.5.1"),
		ProxyPort:     8080,
	}
}

func TestGolden(t *testing.T) {
	s, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "meta-data", s.MetaData)
	golden(t, "user-data", s.UserData)
	golden(t, "network-config", s.NetworkConfig)
}

func TestUserDataContent(t *testing.T) {
	c := testConfig(t)
	b, err := UserData(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("#cloud-config\n")) {
		t.Fatal("user-data does not start with #cloud-config")
	}
	var doc struct {
		Users []struct {
			Name       string   `yaml:"name"`
			Sudo       string   `yaml:"sudo"`
			LockPasswd bool     `yaml:"lock_passwd"`
			Keys       []string `yaml:"ssh_authorized_keys"`
		} `yaml:"users"`
		CACerts    any `yaml:"ca_certs"`
		WriteFiles []struct {
			Path    string `yaml:"path"`
			Content string `yaml:"content"`
			Append  bool   `yaml:"append"`
		} `yaml:"write_files"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Users) != 1 || doc.Users[0].Name != "abox" || !doc.Users[0].LockPasswd ||
		doc.Users[0].Sudo != "ALL=(ALL) NOPASSWD:ALL" || len(doc.Users[0].Keys) != 1 || doc.Users[0].Keys[0] != c.AuthorizedKey {
		t.Errorf("users = %+v", doc.Users)
	}
	// The CA goes in by write_files, never by the ca_certs module (which
	// rebuilds the whole trust store at boot: ~29 s under TCG).
	if doc.CACerts != nil {
		t.Errorf("ca_certs = %v, want the module unused", doc.CACerts)
	}
	files := map[string]string{}
	appended := map[string]bool{}
	for _, f := range doc.WriteFiles {
		files[f.Path] = f.Content
		appended[f.Path] = f.Append
		if f.Path == "/etc/environment" && !f.Append {
			t.Error("/etc/environment would be overwritten, not appended to")
		}
	}
	cas, err := splitCAs(c.CACertPEM)
	if err != nil || len(cas) != 1 {
		t.Fatalf("splitCAs = %v, %v", cas, err)
	}
	for _, path := range []string{
		"/etc/ssl/certs/ca-certificates.crt",
		"/etc/ssl/certs/" + cas[0].Hash + ".0",
		"/etc/ssl/certs/abox-instance-0.pem",
		"/usr/local/share/ca-certificates/abox-instance-0.crt",
	} {
		if strings.TrimSpace(files[path]) != strings.TrimSpace(c.CACertPEM) {
			t.Errorf("%s = %q, want the instance CA", path, files[path])
		}
	}
	if !appended["/etc/ssl/certs/ca-certificates.crt"] {
		t.Error("the system CA bundle would be replaced by the instance CA, not appended to")
	}
	proxy := "http://10.10.5.1:8080"
	for path, want := range map[string][]string{
		"/etc/profile.d/abox-proxy.sh":     {"export http_proxy=" + proxy, "export https_proxy=" + proxy, "export HTTP_PROXY=" + proxy, "export HTTPS_PROXY=" + proxy, "export no_proxy=localhost,127.0.0.1\n"},
		"/etc/environment":                 {"http_proxy=" + proxy, "HTTPS_PROXY=" + proxy, "no_proxy=localhost,127.0.0.1\n"},
		"/etc/apt/apt.conf.d/90abox-proxy": {`Acquire::http::Proxy "` + proxy + `";`, `Acquire::https::Proxy "` + proxy + `";`},
		"/etc/pip.conf":                    {"proxy = " + proxy},
		"/etc/npmrc":                       {"proxy=" + proxy, "https-proxy=" + proxy},
		"/etc/gitconfig":                   {"proxy = " + proxy},
		// sudo resets the environment; these names survive it.
		sudoersProxyFile: {`Defaults env_keep += "http_proxy https_proxy HTTP_PROXY HTTPS_PROXY no_proxy NO_PROXY `, ` JAVA_TOOL_OPTIONS"` + "\n"},
		// Services get the settings from the managers.
		systemdProxyFile: {"[Manager]\nDefaultEnvironment=\"http_proxy=" + proxy + `" "https_proxy=` + proxy + `"`, `"JAVA_TOOL_OPTIONS=-Dhttp.proxyHost=10.10.5.1 -Dhttp.proxyPort=8080 `},
		userdProxyFile:   {"[Manager]\nDefaultEnvironment=\"http_proxy=" + proxy + `"`},
	} {
		content, ok := files[path]
		if !ok {
			t.Errorf("no write_files entry for %s", path)
			continue
		}
		for _, w := range want {
			if !strings.Contains(content, w) {
				t.Errorf("%s lacks %q:\n%s", path, w, content)
			}
		}
		if strings.Contains(content, "healthcheck") {
			t.Errorf("%s exempts the healthcheck domain from the proxy", path)
		}
	}
}

func TestNetworkConfigContent(t *testing.T) {
	b, err := NetworkConfig(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Version   int `yaml:"version"`
		Ethernets map[string]struct {
			Match struct {
				MACAddress string `yaml:"macaddress"`
			} `yaml:"match"`
			DHCP4     bool     `yaml:"dhcp4"`
			DHCP6     bool     `yaml:"dhcp6"`
			Addresses []string `yaml:"addresses"`
			Routes    []struct {
				To, Via string
			} `yaml:"routes"`
			Nameservers struct {
				Addresses []string `yaml:"addresses"`
				Search    []string `yaml:"search"`
			} `yaml:"nameservers"`
		} `yaml:"ethernets"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	e, ok := doc.Ethernets["abox0"]
	if doc.Version != 2 || !ok {
		t.Fatalf("network-config = %+v", doc)
	}
	if e.Match.MACAddress != "52:54:00:ab:cd:ef" {
		t.Errorf("match = %q, want the lowercased MAC", e.Match.MACAddress)
	}
	if e.DHCP4 || e.DHCP6 || len(e.Addresses) != 1 || e.Addresses[0] != "10.10.5.10/24" {
		t.Errorf("addressing = %+v", e)
	}
	if len(e.Routes) != 1 || e.Routes[0].Via != "10.10.5.1" || len(e.Nameservers.Addresses) != 1 || e.Nameservers.Addresses[0] != "10.10.5.1" {
		t.Errorf("routes/nameservers = %+v %+v", e.Routes, e.Nameservers)
	}
	// resolved sends a .local name to unicast DNS only for a routing
	// domain of the link; a plain search domain would also be appended
	// to short names. Without "~." resolved would use the link for
	// nothing else.
	if want := []string{"~" + policy.HealthcheckName, "~."}; !slices.Equal(e.Nameservers.Search, want) {
		t.Errorf("nameservers.search = %q, want %q", e.Nameservers.Search, want)
	}
}

// TestMACQuotedForYAML11 guards against PyYAML (YAML 1.1, what cloud-init
// uses) reading an all-digit MAC as a base-60 integer.
func TestMACQuotedForYAML11(t *testing.T) {
	c := testConfig(t)
	c.MAC = "52:54:00:12:34:56"
	b, err := NetworkConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`macaddress: "52:54:00:12:34:56"`)) {
		t.Errorf("MAC not double-quoted:\n%s", b)
	}
	if py, err := exec.LookPath("python3"); err == nil {
		out, err := cmdIn(py, b, "-c", "import sys,yaml; d=yaml.safe_load(sys.stdin); print(type(d['ethernets']['abox0']['match']['macaddress']).__name__)")
		if err == nil && strings.TrimSpace(string(out)) != "str" {
			t.Errorf("PyYAML reads the MAC as %s, want str", out)
		}
	}
}

func TestInstanceIDStable(t *testing.T) {
	c := testConfig(t)
	a, _ := MetaData(c)
	b, _ := MetaData(c)
	if !bytes.Equal(a, b) {
		t.Error("meta-data differs between two renders of one instance")
	}
	c2 := c
	c2.UUID = "00000000-0000-4000-8000-000000000000"
	d, _ := MetaData(c2)
	if bytes.Equal(a, d) {
		t.Error("a recreated instance (new uuid) keeps the old instance-id")
	}
}

func TestHostname(t *testing.T) {
	for in, want := range map[string]string{"dev": "dev", "Agent_1": "agent-1", "a-": "a", "a__": "a"} {
		if got := Hostname(in); got != want {
			t.Errorf("Hostname(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidate(t *testing.T) {
	leaf, err := os.ReadFile("testdata/leaf.pem")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{"valid", func(*Config) {}, ""},
		{"name injection", func(c *Config) { c.Name = "a'><x" }, "instance name"},
		{"user root", func(c *Config) { c.User = "root" }, "user"},
		{"user yaml", func(c *Config) { c.User = "abox\n  sudo: x" }, "user"},
		{"key with newline", func(c *Config) { c.AuthorizedKey += "\nssh-ed25519 AAAA evil" }, "single line"},
		{"key with options", func(c *Config) { c.AuthorizedKey = `command="/bin/sh" ` + c.AuthorizedKey }, "without options"},
		{"not a key", func(c *Config) { c.AuthorizedKey = "hello" }, "authorized key"},
		{"no ca", func(c *Config) { c.CACertPEM = "" }, "ca certificate"},
		{"private key as ca", func(c *Config) { c.CACertPEM = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n" }, "never a private key"},
		{"leaf as ca", func(c *Config) { c.CACertPEM = string(leaf) }, "not a CA"},
		{"trailing junk", func(c *Config) { c.CACertPEM += "junk" }, "nothing else"},
		{"bad mac", func(c *Config) { c.MAC = "52:54:00:ab:cd" }, "MAC"},
		{"guest outside", func(c *Config) { c.GuestIP = netip.MustParseAddr("10.10.6.10") }, "guest ip"},
		{"guest = gateway", func(c *Config) { c.GuestIP = c.Gateway }, "must differ"},
		{"no port", func(c *Config) { c.ProxyPort = 0 }, "proxy port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t)
			tt.mod(&c)
			err := c.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Validate = %v, want error containing %q", err, tt.wantErr)
			}
			if _, err := Render(c); err == nil {
				t.Error("Render accepted an invalid config")
			}
		})
	}
}

func TestGenerateSSHKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "id_ed25519")
	line, err := GenerateSSHKey(path, "abox@dev", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkAuthorizedKey(line); err != nil {
		t.Errorf("returned line is not a usable authorized key: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("private key mode = %v, want 0600", st.Mode().Perm())
	}
	priv, _ := os.ReadFile(path)
	if !bytes.HasPrefix(priv, []byte("-----BEGIN OPENSSH PRIVATE KEY-----")) {
		t.Errorf("private key is not in OpenSSH format:\n%s", priv)
	}
	pub, _ := os.ReadFile(path + ".pub")
	if strings.TrimSpace(string(pub)) != line {
		t.Errorf(".pub = %q, want %q", pub, line)
	}
	if _, err := GenerateSSHKey(path, "abox@dev", nil); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second GenerateSSHKey = %v, want a refusal to replace the key", err)
	}
	again, _ := os.ReadFile(path)
	if !bytes.Equal(again, priv) {
		t.Error("existing private key was modified")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	if ssh, err := exec.LookPath("ssh-keygen"); err == nil {
		out, err := exec.Command(ssh, "-y", "-f", path).Output()
		if err != nil || !strings.HasPrefix(line, strings.TrimSpace(string(out))) {
			t.Errorf("ssh-keygen -y = %q, %v; want the prefix of %q", out, err, line)
		}
	}
}

type recordingRunner struct {
	args []string
	real bool
}

func (r *recordingRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	r.args = append([]string{name}, args...)
	if r.real {
		return ExecRunner{}.Run(ctx, name, args...)
	}
	// Pretend: create the output file genisoimage would write.
	for i, a := range args {
		if a == "-output" {
			return nil, os.WriteFile(args[i+1], []byte("iso"), 0o600)
		}
	}
	return nil, nil
}

func TestWriteISOCommand(t *testing.T) {
	s, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "seed.iso")
	r := &recordingRunner{}
	if err := WriteISO(context.Background(), r, s, out); err != nil {
		t.Fatal(err)
	}
	// Replace the temporary directory in the recorded command so the
	// golden file is stable.
	var cmd []string
	for _, a := range r.args {
		if strings.HasPrefix(a, dir) {
			a = "WORK/" + filepath.Base(a)
		}
		cmd = append(cmd, a)
	}
	golden(t, "genisoimage.cmd", []byte(strings.Join(cmd, "\n")+"\n"))
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("seed iso: %v %v", st, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("work files left behind: %v", entries)
	}
}

// TestWriteISOReal builds a real ISO and reads it back with isoinfo when
// genisoimage is installed.
func TestWriteISOReal(t *testing.T) {
	if _, err := exec.LookPath("genisoimage"); err != nil {
		t.Skip("genisoimage not installed")
	}
	s, err := Render(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "seed.iso")
	if err := WriteISO(context.Background(), &recordingRunner{real: true}, s, out); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("isoinfo"); err != nil {
		return
	}
	info, err := exec.Command("isoinfo", "-d", "-i", out).Output()
	if err != nil || !strings.Contains(string(info), "Volume id: cidata") {
		t.Errorf("isoinfo -d: %v\n%s", err, info)
	}
	for name, want := range map[string][]byte{"user-data": s.UserData, "meta-data": s.MetaData, "network-config": s.NetworkConfig} {
		got, err := exec.Command("isoinfo", "-R", "-i", out, "-x", "/"+name).Output()
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s in the ISO differs: %v", name, err)
		}
	}
}

func cmdIn(name string, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	return cmd.Output()
}
