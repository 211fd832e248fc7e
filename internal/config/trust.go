package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/termtext"
)

// Widening is a setting that widens what the guest may reach, or replaces
// a hardened default: it takes effect only once the user trusts the file.
type Widening struct {
	Key string `json:"key"`
	Why string `json:"why"`
}

// Widenings lists what in c needs trust; empty means the file only
// tightens or keeps the defaults. The allowlist counted is the inline one;
// Project.Widenings adds the allowlist file's.
func (c Config) Widenings() []Widening {
	var names []string
	for _, e := range c.Allowlist {
		names = append(names, e.String())
	}
	return c.widenings(names)
}

// Widenings lists what the file needs trust for, its allowlist file
// included.
func (p *Project) Widenings() []Widening { return p.Config.widenings(p.allowlist) }

// widenings is Widenings with allow the file's whole allowlist. Every entry
// widens: the default allowlist is empty, and a name on it is a place the
// guest can send what it holds.
func (c Config) widenings(allow []string) []Widening {
	var out []Widening
	add := func(key, format string, args ...any) {
		out = append(out, Widening{Key: key, Why: fmt.Sprintf(format, args...)})
	}
	if len(allow) > 0 {
		add("allowlist", "lets the guest reach %d name(s): %s", len(allow), strings.Join(allow, ", "))
	}
	// The host's resources past the defaults: a guest fills its disk
	// (the host's), and memory and CPUs are taken from the host's others.
	if c.CPUs > DefaultCPUs {
		add("cpus", "gives the guest %d virtual CPUs (default %d)", c.CPUs, DefaultCPUs)
	}
	if c.MemoryMiB > DefaultMemoryMiB {
		add("memory", "gives the guest %d MiB of the host's memory (default %d)", c.MemoryMiB, DefaultMemoryMiB)
	}
	if c.DiskGiB > DefaultDiskGiB {
		add("disk", "lets the guest fill %d GiB of the host's disk (default %d)", c.DiskGiB, DefaultDiskGiB)
	}
	// Another base is any image installed on this host, with whatever
	// software, accounts or keys it holds (an empty Base is an imported
	// instance's, whose disk the archive carries).
	if c.Base != "" && c.Base != DefaultBase {
		add("base", "boots the guest from the installed image %s instead of %s: any image on this host, with what it holds", c.Base, DefaultBase)
	}
	if c.Template != "" {
		add("overrides.libvirt.template", "replaces the hardened libvirt domain with %s", c.Template)
	}
	if len(c.AllowPrivate) > 0 {
		var s []string
		for _, p := range c.AllowPrivate {
			s = append(s, p.String())
		}
		why := "lets the guest reach private addresses " + strings.Join(s, ", ")
		for _, w := range c.Warnings {
			why += " (warning: " + w + ")"
		}
		add("allow_private", "%s", why)
	}
	var extra []string
	for _, p := range c.Ports {
		if p != 80 && p != 443 {
			extra = append(extra, fmt.Sprint(p))
		}
	}
	if len(extra) > 0 {
		add("ports", "lets the proxy connect to ports %s besides 80 and 443", strings.Join(extra, ", "))
	}
	if c.Passive {
		add("mode", "passive mode records instead of blocking: the guest reaches any host")
	}
	if c.NoMITM {
		add("mitm.enabled", "turns TLS interception off: HTTPS is tunnelled unseen")
	}
	if len(c.MITMExceptions) > 0 {
		add("mitm.exceptions", "tunnels %s unseen", strings.Join(c.MITMExceptions, ", "))
	}
	if len(c.Upstreams) > 0 {
		add("dns.upstreams", "replaces the host's resolver with %s", strings.Join(c.Upstreams, ", "))
	}
	if c.UpstreamProxy != nil {
		if c.ProxyCredentials != "" {
			add("upstream_proxy.url", "sends the filters' egress through %s, with the credentials in %s", c.UpstreamProxy.Redacted(), c.ProxyCredentials)
		} else {
			add("upstream_proxy.url", "sends the filters' egress through %s", c.UpstreamProxy.Redacted())
		}
	}
	if c.UpstreamCA != "" {
		add("upstream_ca", "makes the proxy trust the roots in %s for origin TLS", c.UpstreamCA)
	}
	if c.Monitor {
		// A virtio-serial channel that a host process reads: the guest
		// writes to it what it likes.
		key := "monitor.enabled"
		if c.MonitorBundle != "" {
			key = "monitor.bundle"
		}
		add(key, "adds a channel from the guest to a host process (abox's monitor reads what the guest sends on it)")
	}
	if c.Overlay != "" {
		// The directory's files as they are when provisioning runs,
		// untracked ones too: nothing of it is part of the trust hash.
		if c.Overlay == "." {
			add("provision.overlay", "copies the whole project directory into the guest, untracked files and .git included (a .env, .git/config with a token): the guest holds what they hold")
		} else {
			add("provision.overlay", "copies %s into the guest, untracked files in it too: the guest holds what they hold", c.Overlay)
		}
	}
	if len(c.Forwards) > 0 {
		// A host program that connects to one of these ports (a database
		// client, a tool with credentials for a local service) would be
		// talking to the guest.
		var s []string
		for _, f := range c.Forwards {
			s = append(s, fmt.Sprintf("127.0.0.1:%d", f.HostPort))
		}
		add("forwards", "puts guest services on the host's %s, where host programs connecting there reach the guest", strings.Join(s, ", "))
	}
	return out
}

// TrustHash is what trust is given to: the file's absolute path, its exact
// bytes and the content of the files it names whose content widens (the
// allowlist file, the template and the CA bundle, as Load read them). A
// change to any of them asks again.
func (p *Project) TrustHash() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "abox-trust-v1\x00%s\x00%d\x00", p.Path, len(p.Doc.Raw))
	h.Write(p.Doc.Raw)
	for _, r := range []ref{{key: "allowlist_file", path: p.AllowlistFile}, {key: "upstream_ca", path: p.UpstreamCA}, {key: "overrides.libvirt.template", path: p.Template}} {
		if r.path == "" {
			continue
		}
		b, err := p.ReadFile(r.key, r.path)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(h, "\x00%s\x00%s\x00%x", r.key, r.path, sum)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// TrustStore keeps the hashes of trusted files under the abox data root,
// never in the project (a repository must not be able to ship its own).
type TrustStore struct {
	// Dir is the store's directory, such as <data root>/trust.
	Dir string
}

type trustRecord struct {
	File      string     `json:"file"`
	TrustedAt time.Time  `json:"trusted_at"`
	Widenings []Widening `json:"widenings"`
}

// ErrUntrusted means the file widens the sandbox and its content is not
// trusted.
var ErrUntrusted = errors.New("not trusted")

// UntrustedError lists what needs trust.
type UntrustedError struct {
	File      string
	Widenings []Widening
}

func (e *UntrustedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s widens the sandbox and this content is %s:", e.File, ErrUntrusted)
	for _, w := range e.Widenings {
		fmt.Fprintf(&b, "\n  %s: %s", w.Key, termtext.Clean(w.Why))
	}
	return b.String()
}

func (e *UntrustedError) Unwrap() error { return ErrUntrusted }

func (s TrustStore) path(hash string) string { return filepath.Join(s.Dir, hash+".json") }

// Check returns nil when p needs no trust or its exact content is trusted,
// else an *UntrustedError.
func (s TrustStore) Check(p *Project) error {
	w := p.Widenings()
	if len(w) == 0 {
		return nil
	}
	h, err := p.TrustHash()
	if err != nil {
		return err
	}
	if _, err := os.Stat(s.path(h)); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("checking trust of %s: %w", p.Path, err)
	}
	return &UntrustedError{File: p.Path, Widenings: w}
}

// Trust records p's current content as trusted.
func (s TrustStore) Trust(p *Project) error {
	h, err := p.TrustHash()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("trusting %s: %w", p.Path, err)
	}
	b, err := json.MarshalIndent(trustRecord{File: p.Path, TrustedAt: time.Now().UTC(), Widenings: slices.Clip(p.Widenings())}, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(s.path(h), append(b, '\n'), 0o600)
}
