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

	"github.com/abox-dev/abox/internal/allowlist"
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
	l, err := allowlist.NewLines(c.Allowlist)
	if err != nil {
		// Validate refused such a list; count it as widening all the same.
		return append([]Widening{{Key: "allowlist", Why: err.Error()}}, c.widenings(nil)...)
	}
	return c.widenings(l)
}

// Widenings lists what the file needs trust for, its allowlist file
// included.
func (p *Project) Widenings() []Widening { return p.Config.widenings(p.AllowlistList()) }

// widenings is Widenings with allow the file's whole allowlist. Every entry
// widens: the default allowlist is empty, and a name on it is a place the
// guest can send what it holds.
func (c Config) widenings(allow *allowlist.List) []Widening {
	var out []Widening
	add := func(key, format string, args ...any) {
		out = append(out, Widening{Key: key, Why: fmt.Sprintf(format, args...)})
	}
	if n := allow.Len(); n > 0 {
		var names []string
		for _, e := range allow.Entries() {
			s := e.String()
			if rs := allow.Rules(s); rs != nil {
				s += " (rules " + rs.String() + ")"
			}
			names = append(names, s)
		}
		add("allowlist", "lets the guest reach %d name(s): %s", n, strings.Join(names, ", "))
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
	// A binding lets the guest use the secret on the host it names, as
	// far as its rules allow: each is a place the credential goes.
	for _, s := range c.Secrets {
		add("secrets", "sends %s", s)
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
	// Baseline is what was trusted, for telling a later content that only
	// narrows it; nil in records written before rules existed.
	Baseline *baseline `json:"baseline,omitempty"`
}

// baseline is what a trusted content allowed, in the terms Project.Since
// compares: its allowlist lines, and the content of each trusted file
// other than the allowlist file (whose lines are compared instead).
type baseline struct {
	Allowlist []string `json:"allowlist"`
	// Files maps a key (upstream_ca, overrides.libvirt.template) to the
	// SHA-256 of the content trusted, hex.
	Files map[string]string `json:"files,omitempty"`
	// Secrets are the secret bindings trusted; none in records written
	// before bindings existed, so that any binding asks.
	Secrets []secretBaseline `json:"secrets,omitempty"`
}

func (p *Project) baseline() (*baseline, error) {
	b := &baseline{Allowlist: p.MergedAllowlist(), Files: map[string]string{}, Secrets: secretBaselines(p.Secrets)}
	for _, r := range []ref{{key: "upstream_ca", path: p.UpstreamCA}, {key: "overrides.libvirt.template", path: p.Template}} {
		if r.path == "" {
			continue
		}
		c, err := p.ReadFile(r.key, r.path)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(c)
		b.Files[r.key] = hex.EncodeToString(sum[:])
	}
	return b, nil
}

// since lists how p allows more than the trusted content rec: allowlist
// lines that allow more (allowlist.Widenings: a new name, a new or wider
// rule, a name whose rules are all gone), secret bindings no trusted one
// covers (secretWidenings), every other widening setting not
// written exactly as it was, and a trusted file whose content changed.
// Empty means p only narrows rec, or restates it.
func (p *Project) since(rec trustRecord) ([]Widening, error) {
	prev, err := parseLines(rec.Baseline.Allowlist)
	if err != nil {
		return nil, err
	}
	var out []Widening
	for _, c := range allowlist.Widenings(prev, p.AllowlistList()) {
		out = append(out, Widening{Key: "allowlist", Why: c.Entry + ": " + c.Why})
	}
	had := map[Widening]bool{}
	for _, w := range rec.Widenings {
		had[w] = true
	}
	for _, w := range p.Widenings() {
		if w.Key != "allowlist" && w.Key != "secrets" && !had[w] {
			out = append(out, w)
		}
	}
	ws, err := secretWidenings(rec.Baseline.Secrets, p.Secrets)
	if err != nil {
		return nil, err
	}
	out = append(out, ws...)
	now, err := p.baseline()
	if err != nil {
		return nil, err
	}
	for k, sum := range now.Files {
		if rec.Baseline.Files[k] != sum {
			out = append(out, Widening{Key: k, Why: "its content changed since it was trusted"})
		}
	}
	slices.SortStableFunc(out, func(a, b Widening) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

func parseLines(lines []string) (*allowlist.List, error) {
	parsed := make([]allowlist.Line, 0, len(lines))
	for _, s := range lines {
		ln, err := allowlist.ParseLine(s)
		if err != nil {
			return nil, err
		}
		parsed = append(parsed, ln)
	}
	return allowlist.NewLines(parsed)
}

// ErrUntrusted means the file widens the sandbox and its content is not
// trusted.
var ErrUntrusted = errors.New("not trusted")

// UntrustedError lists what needs trust.
type UntrustedError struct {
	File      string
	Widenings []Widening
	// Since lists how the content allows more than the one last trusted
	// for the file, when there is one; TrustedAt is when that was.
	Since     []Widening
	TrustedAt time.Time
}

func (e *UntrustedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s widens the sandbox and this content is %s:", e.File, ErrUntrusted)
	for _, w := range e.Widenings {
		fmt.Fprintf(&b, "\n  %s: %s", w.Key, termtext.Clean(w.Why))
	}
	if len(e.Since) > 0 {
		fmt.Fprintf(&b, "\nbeyond the content trusted at %s, it:", e.TrustedAt.Format(time.RFC3339))
		for _, w := range e.Since {
			fmt.Fprintf(&b, "\n  %s: %s", w.Key, termtext.Clean(w.Why))
		}
	}
	return b.String()
}

func (e *UntrustedError) Unwrap() error { return ErrUntrusted }

func (s TrustStore) path(hash string) string { return filepath.Join(s.Dir, hash+".json") }

// maxRecords bounds how many trust records Check reads looking for a
// baseline of the file.
const maxRecords = 10000

// Check returns nil when p needs no trust, when its exact content is
// trusted, or when it only narrows a content trusted for the same file
// (since is empty: a pull that narrows a rule or drops a name asks
// nothing), else an *UntrustedError.
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
	ue := &UntrustedError{File: p.Path, Widenings: w}
	recs, err := s.records(p.Path)
	if err != nil {
		return fmt.Errorf("checking trust of %s: %w", p.Path, err)
	}
	for _, rec := range recs {
		since, err := p.since(rec)
		if err != nil {
			// A record this abox cannot read is no baseline.
			continue
		}
		if len(since) == 0 {
			return nil
		}
		if ue.Since == nil || rec.TrustedAt.After(ue.TrustedAt) {
			ue.Since, ue.TrustedAt = since, rec.TrustedAt
		}
	}
	return ue
}

// records returns the trust records of file that carry a baseline.
func (s TrustStore) records(file string) ([]trustRecord, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []trustRecord
	for i, de := range ents {
		if i >= maxRecords {
			break
		}
		if !de.Type().IsRegular() || !strings.HasSuffix(de.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.Dir, de.Name()))
		if err != nil {
			continue
		}
		var rec trustRecord
		if json.Unmarshal(b, &rec) != nil || rec.File != file || rec.Baseline == nil {
			continue
		}
		out = append(out, rec)
	}
	return out, nil
}

// Trust records p's current content as trusted.
func (s TrustStore) Trust(p *Project) error {
	h, err := p.TrustHash()
	if err != nil {
		return err
	}
	bl, err := p.baseline()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("trusting %s: %w", p.Path, err)
	}
	b, err := json.MarshalIndent(trustRecord{File: p.Path, TrustedAt: time.Now().UTC(), Widenings: slices.Clip(p.Widenings()), Baseline: bl}, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(s.path(h), append(b, '\n'), 0o600)
}
