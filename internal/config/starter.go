package config

import (
	"fmt"
	"sort"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
)

// Preset is a named group of allowlist entries a common agent or
// toolchain needs, written into the starter as its own commented block so
// a user can see and cut them.
type Preset struct {
	Name    string
	Doc     string
	Entries []string
}

// Presets known to `abox init --preset`.
var presets = []Preset{
	{"claude", "Anthropic's API (Claude Code and other agents)", []string{"api.anthropic.com"}},
	{"codex", "OpenAI's API (Codex and other agents)", []string{"api.openai.com", "auth.openai.com"}},
	{"github", "GitHub over HTTPS: clone, fetch, push and the API, for any repository", []string{"github.com", "api.github.com", "codeload.github.com", "objects.githubusercontent.com", "raw.githubusercontent.com"}},
	{"debian", "Debian packages (apt)", []string{"deb.debian.org", "security.debian.org"}},
	{"npm", "the npm registry", []string{"registry.npmjs.org"}},
	{"pypi", "the Python Package Index (pip)", []string{"pypi.org", "files.pythonhosted.org"}},
	{"go", "Go modules and the checksum database", []string{"proxy.golang.org", "sum.golang.org"}},
	{"cargo", "Rust crates (cargo)", []string{"index.crates.io", "static.crates.io", "crates.io"}},
	{"maven", "Maven Central and the Gradle plugin portal", []string{"repo.maven.apache.org", "repo1.maven.org", "plugins.gradle.org", "services.gradle.org"}},
}

// Presets lists the presets by name.
func Presets() []Preset {
	out := append([]Preset(nil), presets...)
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// PresetNames is the comma-separated list for help texts: these presets,
// then the allowlist's presets of rules (allowlist.Presets).
func PresetNames() string {
	var n []string
	for _, p := range Presets() {
		n = append(n, p.Name)
	}
	for _, p := range allowlist.Presets() {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}

// Starter renders the commented abox.yaml `abox init` writes: every key of
// version 1, the active ones at their hardened defaults, the ones that
// widen the sandbox commented out and marked as needing `abox trust`.
func Starter(name string, presetNames []string) (string, error) {
	byName := map[string]Preset{}
	for _, p := range presets {
		byName[p.Name] = p
	}
	var allow strings.Builder
	for _, n := range presetNames {
		if p, ok := byName[n]; ok {
			fmt.Fprintf(&allow, "  # preset %s: %s\n", p.Name, p.Doc)
			for _, e := range p.Entries {
				fmt.Fprintf(&allow, "  - %s\n", e)
			}
			continue
		}
		p, ok := allowlist.PresetByName(n)
		if !ok {
			return "", fmt.Errorf("no preset %q (known: %s)", n, PresetNames())
		}
		// Lines with rules, quoted: a pattern's * and ? mean nothing to
		// YAML inside quotes.
		fmt.Fprintf(&allow, "  # preset %s: %s\n", p.Name, strings.ReplaceAll(p.About, "\n", "\n  # "))
		for _, l := range p.Lines {
			fmt.Fprintf(&allow, "  - %q\n", l)
		}
	}
	allowBlock := "allowlist: []\n"
	if allow.Len() > 0 {
		allowBlock = "allowlist:\n" + allow.String()
	}
	text := fmt.Sprintf(starterTemplate, name, allowBlock)
	// Presets that name one host with rules and without ("github" and
	// "github-readonly") cannot go together.
	if d, err := Parse(strings.NewReader(text), FileName); err != nil {
		return "", fmt.Errorf("presets %s together: %w", strings.Join(presetNames, ", "), err)
	} else if _, err := d.Validate(); err != nil {
		return "", fmt.Errorf("presets %s together: %w", strings.Join(presetNames, ", "), err)
	}
	return text, nil
}

const starterTemplate = `# abox.yaml: the sandbox this project's agent runs in (abox help abox-yaml).
# ` + "`abox up`" + ` creates and starts it, ` + "`abox down`" + ` stops it, ` + "`abox down --rm`" + ` removes it.
# Unknown keys and wrong types are errors. Settings marked "trust" widen what
# the guest may reach: they take effect only after ` + "`abox trust`" + ` of this exact file.
version: 1

# The instance name (letters, digits, '-', '_').
name: %s

# Base image (abox base list; another than debian-12: trust), and the
# guest's size (more than these: trust).
base: debian-12
cpus: 2
memory: 1024          # MiB
disk: 10              # GiB
accel: auto           # kvm, tcg or auto

# Host names the guest may reach, through the DNS filter and the proxy
# (trust: abox init trusts the entries it writes; an edit that allows more
# asks again, one that only narrows does not).
# "example.com" is exactly that name; "*.example.com" every name below it.
# An item may carry a rule, as an allowlist line does, and then the host
# allows only what its rules allow (abox allowlist presets; docs/policy.md):
#   - "api.github.com GET,HEAD /**"
#   - host: registry.example.org
#     rules: ["GET,HEAD /**", "PUT /incoming/*"]
#     audit: true             # allow all, log what the rules would refuse
%s
# allowlist_file: allow.txt   # more lines, in allowlist syntax, in this directory

# mode: active                # passive records instead of blocking (trust)

# Destination ports the proxy allows (default 80 and 443; others: trust).
# ports: [80, 443]

# Private address ranges the guest may reach through the filters (trust).
# allow_private: [10.20.0.0/16]

# TLS interception with the instance's CA; off or exceptions: trust.
# mitm:
#   enabled: true
#   exceptions: [pinned.example.com]

# Resolvers the filters use (default: the host's; others: trust).
# dns:
#   upstreams: [192.0.2.53]

# A parent proxy for the filters' own egress (trust). Credentials go in a
# file (USER:PASSWORD), never in this file or on a command line.
# upstream_proxy:
#   url: http://proxy.example.com:3128
#   credentials_file: ~/.config/abox/proxy-credentials

# Extra roots the proxy trusts for origin TLS, a PEM file here (trust).
# upstream_ca: certs/corp-root.pem

# Runtime monitor in the guest (trust: a channel from the guest to the host).
# monitor:
#   enabled: false
#   # Tetragon for the guest: a bundle file here (upstream's linux-tarball
#   # layout), or "release" for the pinned upstream release (needs internet).
#   bundle: tetragon-v1.7.1-amd64.tar.gz

# Replace the hardened libvirt domain with a template here (trust).
# overrides:
#   libvirt:
#     template: domain.xml

# Run on the first ` + "`abox up`" + ` (and ` + "`abox up --provision`" + `), as root, in active mode:
# the overlay directory is copied into the guest's /, then the scripts run in order.
# An overlay needs trust: every file in it goes to the guest, untracked ones too
# (name a directory of its own, never "." with its .env and .git).
# provision:
#   overlay: overlay
#   scripts: [setup.sh]

# Host 127.0.0.1:HOSTPORT -> guest 127.0.0.1:GUESTPORT, over SSH (trust: host
# programs that connect to HOSTPORT reach the guest).
# forwards: ["8080:8080"]

# Secrets of the host's store the proxy adds to requests (trust): store the
# value on the host with ` + "`abox secret set NAME`" + `; the guest only gets a
# placeholder in $NAME. Names only here, never a value. The host must be on
# the allowlist; one of bearer: true, basic: USER or header: NAME.
# secrets:
#   - {name: OPENAI_API_KEY, host: api.openai.com, bearer: true, rules: ["POST /v1/**"]}
`
