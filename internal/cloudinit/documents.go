package cloudinit

import (
	"bytes"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/abox-dev/abox/internal/policy"
)

// The structs below mirror the cloud-init keys abox uses; yaml.v3 does the
// quoting, so no value can break out of its field.

type metaData struct {
	InstanceID    string `yaml:"instance-id"`
	LocalHostname string `yaml:"local-hostname"`
}

type userData struct {
	Users       []any      `yaml:"users"`
	DisableRoot bool       `yaml:"disable_root"`
	WriteFiles  []fileSpec `yaml:"write_files"`
	// SSHKeys installs the host key generated at create, whose public half
	// abox pins in known_hosts: the first connection is already verified.
	SSHKeys      map[string]string `yaml:"ssh_keys,omitempty"`
	SSHDeleteKey bool              `yaml:"ssh_deletekeys"`
}

type user struct {
	Name              string   `yaml:"name"`
	Gecos             string   `yaml:"gecos"`
	Shell             string   `yaml:"shell"`
	Sudo              string   `yaml:"sudo"`
	LockPasswd        bool     `yaml:"lock_passwd"`
	SSHAuthorizedKeys []string `yaml:"ssh_authorized_keys"`
}

type fileSpec struct {
	Path        string `yaml:"path"`
	Owner       string `yaml:"owner"`
	Permissions string `yaml:"permissions"`
	Append      bool   `yaml:"append,omitempty"`
	Content     string `yaml:"content"`
}

type networkConfig struct {
	Version   int                 `yaml:"version"`
	Ethernets map[string]ethernet `yaml:"ethernets"`
}

type ethernet struct {
	Match       match       `yaml:"match"`
	SetName     string      `yaml:"set-name"`
	DHCP4       bool        `yaml:"dhcp4"`
	DHCP6       bool        `yaml:"dhcp6"`
	Addresses   []quoted    `yaml:"addresses"`
	Routes      []route     `yaml:"routes"`
	Nameservers nameservers `yaml:"nameservers"`
}

type match struct {
	MACAddress quoted `yaml:"macaddress"`
}

type route struct {
	To  quoted `yaml:"to"`
	Via quoted `yaml:"via"`
}

type nameservers struct {
	Addresses []quoted `yaml:"addresses"`
	Search    []quoted `yaml:"search,omitempty"`
}

// quoted is always emitted double-quoted. yaml.v3 writes YAML 1.2, where
// 52:54:00:12:34:56 is a string, but cloud-init reads YAML 1.1 (PyYAML),
// where an all-digit MAC is a base-60 integer (41135085296) and would never
// match the NIC.
type quoted string

func (q quoted) MarshalYAML() (any, error) {
	return &yaml.Node{Kind: yaml.ScalarNode, Style: yaml.DoubleQuotedStyle, Value: string(q)}, nil
}

func marshal(v any, header string) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// MetaData renders the NoCloud meta-data document.
func MetaData(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b, err := marshal(metaData{InstanceID: InstanceID(c.Name, c.UUID), LocalHostname: Hostname(c.Name)}, "")
	if err != nil {
		return nil, fmt.Errorf("encoding meta-data: %w", err)
	}
	return b, nil
}

// NetworkConfig renders the network-config (version 2) document: the
// static guest address, the gateway as default route and resolver, matched
// by MAC so it applies whatever the guest names its NIC. There is no DHCP
// on the instance network, and IPv6 is dropped by the packet filter.
//
// The healthcheck name is a routing domain of the link ("~name", written
// to networkd's Domains=): systemd-resolved never sends a .local name to a
// unicast DNS server otherwise (it asks mDNS, which the packet filter
// drops), so `getent hosts healthcheck.abox.local` would fail in the guest
// while `dig @gateway` answers. A routing domain is not a search domain:
// no short name gets it appended. "~." goes with it: resolved stops using
// a link that has routing domains for every other name (DefaultRoute
// off), and the guest then resolved nothing but the healthcheck.
func NetworkConfig(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	nc := networkConfig{
		Version: 2,
		Ethernets: map[string]ethernet{"abox0": {
			Match: match{MACAddress: quoted(strings.ToLower(c.MAC))},
			// A stable name the base image's networkd drop-ins can rely on
			// (the debian-12 image turns IPv6 off on eth0).
			SetName:   "eth0",
			Addresses: []quoted{quoted(c.guestPrefix())},
			Routes:    []route{{To: "0.0.0.0/0", Via: quoted(c.Gateway.String())}},
			Nameservers: nameservers{
				Addresses: []quoted{quoted(c.Gateway.String())},
				Search:    []quoted{quoted("~" + policy.HealthcheckName), "~."},
			},
		}},
	}
	b, err := marshal(nc, "")
	if err != nil {
		return nil, fmt.Errorf("encoding network-config: %w", err)
	}
	return b, nil
}

// sshdConfig makes the guest's sshd take keys only (abox ssh pins the host
// key and refuses forwarding on its side).
const sshdConfig = `# Written by abox.
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
`

// The CA bundle Debian and Ubuntu build from /usr/local/share/ca-certificates;
// tools that do not read the system store by default are pointed at it.
const systemCABundle = "/etc/ssl/certs/ca-certificates.crt"

// caFiles adds the instance CA to the trust store the base image already
// carries, the way update-ca-certificates would leave it, without running
// anything at boot: cloud-init's ca_certs module rebuilt the whole store
// (openssl rehash over every root, and a fork per certificate) and took
// about 29 s of a 65 s boot under TCG. The bundle gets the PEM appended (Go,
// curl, apt's GnuTLS, git, npm and pip through the variables below read
// it), /etc/ssl/certs gets the PEM and its subject-hash name (OpenSSL's
// directory lookup: Python's ssl, openssl s_client), and
// /usr/local/share/ca-certificates keeps the source so that a later
// update-ca-certificates in the guest (any package that triggers it, or
// ca-certificates-java building a Java keystore) keeps the CA trusted.
func caFiles(c Config) ([]fileSpec, error) {
	cas, err := splitCAs(c.CACertPEM)
	if err != nil {
		return nil, err
	}
	var out []fileSpec
	for i, ca := range cas {
		base := fmt.Sprintf("abox-instance-%d", i)
		out = append(out,
			fileSpec{Path: "/usr/local/share/ca-certificates/" + base + ".crt", Owner: "root:root", Permissions: "0644", Content: ca.PEM},
			fileSpec{Path: "/etc/ssl/certs/" + base + ".pem", Owner: "root:root", Permissions: "0644", Content: ca.PEM},
			fileSpec{Path: "/etc/ssl/certs/" + ca.Hash + ".0", Owner: "root:root", Permissions: "0644", Content: ca.PEM},
			fileSpec{Path: systemCABundle, Owner: "root:root", Permissions: "0644", Append: true, Content: ca.PEM},
		)
	}
	return out, nil
}

// toolConfigs point the guest tools that read no proxy variable (or not
// the system CA) at the proxy u and the CA bundle.
func toolConfigs(u string) []fileSpec {
	return []fileSpec{
		{Path: "/etc/apt/apt.conf.d/90abox-proxy", Owner: "root:root", Permissions: "0644", Content: fmt.Sprintf(
			"Acquire::http::Proxy \"%s\";\nAcquire::https::Proxy \"%s\";\n", u, u)},
		{Path: "/etc/pip.conf", Owner: "root:root", Permissions: "0644", Content: fmt.Sprintf(
			"[global]\nproxy = %s\ncert = %s\n", u, systemCABundle)},
		{Path: "/etc/npmrc", Owner: "root:root", Permissions: "0644", Content: fmt.Sprintf(
			"proxy=%s\nhttps-proxy=%s\ncafile=%s\n", u, u, systemCABundle)},
		{Path: "/etc/gitconfig", Owner: "root:root", Permissions: "0644", Content: fmt.Sprintf(
			"[http]\n\tproxy = %s\n\tsslCAInfo = %s\n", u, systemCABundle)},
	}
}

// ProxySettings names what the seed sets so that the guest's tools use the
// proxy at proxyURL: the files that must still mention it (the shells'
// profile and PAM environment, the service managers' environment, apt,
// pip, npm, git) and the variables every
// session must have (proxy, CA and JVM settings). doctor checks each.
func ProxySettings(proxyURL string) (files, variables []string) {
	files = []string{"/etc/profile.d/abox-proxy.sh", "/etc/environment", systemdProxyFile, userdProxyFile}
	for _, f := range toolConfigs(proxyURL) {
		files = append(files, f.Path)
	}
	for _, kv := range proxyEnv(Config{}) {
		variables = append(variables, kv[0])
	}
	return files, variables
}

// proxyEnv is the environment every shell and service should see. The
// healthcheck domain is not in no_proxy on purpose: it is answered by the
// proxy itself.
func proxyEnv(c Config) [][2]string {
	u := c.ProxyURL()
	noProxy := "localhost,127.0.0.1"
	return [][2]string{
		{"http_proxy", u}, {"https_proxy", u},
		{"HTTP_PROXY", u}, {"HTTPS_PROXY", u},
		{"no_proxy", noProxy}, {"NO_PROXY", noProxy},
		// npm and Node.js ignore the system trust store and the
		// variables above unless told.
		{"npm_config_proxy", u}, {"npm_config_https_proxy", u},
		{"NODE_EXTRA_CA_CERTS", systemCABundle},
		// Python's requests uses certifi's bundle, not the system's.
		{"REQUESTS_CA_BUNDLE", systemCABundle},
		// cargo reads the proxy variables; its CA file is made explicit
		// for builds whose curl has no default bundle.
		{"CARGO_HTTP_CAINFO", systemCABundle},
		// The JVM (java, Maven, Gradle) reads no proxy variable; these
		// system properties reach every JVM started. Its trust store is
		// built from the system's by ca-certificates-java.
		{"JAVA_TOOL_OPTIONS", javaProxyOptions(c)},
	}
}

// UserData renders the #cloud-config user-data document: the login user
// with the instance key (no password, passwordless sudo), the instance CA
// in the system trust store, and proxy settings for shells, apt, pip, npm
// and git (curl and wget read the environment).
func UserData(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	u := c.ProxyURL()
	var profile, environment strings.Builder
	profile.WriteString("# Written by abox: all traffic leaves through the instance proxy.\n")
	environment.WriteString("# abox proxy settings\n")
	for _, kv := range proxyEnv(c) {
		fmt.Fprintf(&profile, "export %s=%s\n", kv[0], shellValue(kv[1]))
		fmt.Fprintf(&environment, "%s=%s\n", kv[0], pamEnvValue(kv[1]))
	}
	ud := userData{
		Users: []any{
			// "default" would also create the image's stock user (such
			// as debian) with whatever access the image gives it.
			user{
				Name:              c.User,
				Gecos:             "abox",
				Shell:             "/bin/bash",
				Sudo:              "ALL=(ALL) NOPASSWD:ALL",
				LockPasswd:        true,
				SSHAuthorizedKeys: []string{c.AuthorizedKey},
			},
		},
		DisableRoot:  true,
		SSHDeleteKey: true,
		WriteFiles: []fileSpec{
			// sshd reads this before it first starts (write_files runs in
			// cloud-init's init stage). Setting ssh_pwauth instead would make
			// cloud-init restart sshd in a later stage, refusing connections
			// just after the guest first answered.
			{Path: "/etc/ssh/sshd_config.d/10-abox.conf", Owner: "root:root", Permissions: "0644", Content: sshdConfig},
			{Path: "/etc/profile.d/abox-proxy.sh", Owner: "root:root", Permissions: "0644", Content: profile.String()},
			// Appended: images may already set PATH or locale here.
			{Path: "/etc/environment", Owner: "root:root", Permissions: "0644", Append: true, Content: environment.String()},
			{Path: sudoersProxyFile, Owner: "root:root", Permissions: "0440", Content: sudoersEnvKeep(c)},
			{Path: systemdProxyFile, Owner: "root:root", Permissions: "0644", Content: systemdEnvironment(c)},
			{Path: userdProxyFile, Owner: "root:root", Permissions: "0644", Content: systemdEnvironment(c)},
		},
	}
	ud.WriteFiles = append(ud.WriteFiles, toolConfigs(u)...)
	if files, env := placeholderFiles(c); len(files) > 0 {
		ud.WriteFiles = append(ud.WriteFiles, files...)
		ud.WriteFiles = append(ud.WriteFiles, fileSpec{Path: "/etc/environment", Owner: "root:root", Permissions: "0644", Append: true, Content: env})
	}
	cas, err := caFiles(c)
	if err != nil {
		return nil, fmt.Errorf("encoding user-data: %w", err)
	}
	ud.WriteFiles = append(ud.WriteFiles, cas...)
	if c.Monitor {
		ud.WriteFiles = append(ud.WriteFiles, monitorFiles()...)
	}
	if c.HostKeyPEM != "" {
		ud.SSHKeys = map[string]string{
			"ed25519_private": strings.TrimSpace(c.HostKeyPEM) + "\n",
			"ed25519_public":  strings.TrimSpace(c.HostPublicKey),
		}
	}
	b, err := marshal(ud, "#cloud-config\n")
	if err != nil {
		return nil, fmt.Errorf("encoding user-data: %w", err)
	}
	return b, nil
}
