package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/validate"
)

// Hardened defaults, the same as `abox create`'s.
const (
	DefaultBase      = "debian-12"
	DefaultCPUs      = 2
	DefaultMemoryMiB = 1024
	DefaultDiskGiB   = 10
	DefaultAccel     = "auto"
)

// Upper bounds: a repository's file must not be able to ask the host for
// everything it has.
const (
	MaxCPUs      = 64
	MaxMemoryMiB = 256 << 10
	MaxDiskGiB   = 2048
	MaxScripts   = 64
	MaxForwards  = 64
	MaxEntries   = 10000
)

// Config is a validated abox.yaml with the defaults applied. Paths are
// local to the project directory (filepath.IsLocal) and are opened
// through an os.Root there, so no file outside the project is ever read
// on the file's behalf.
type Config struct {
	Name      string
	Base      string
	CPUs      uint
	MemoryMiB uint
	DiskGiB   uint
	Accel     string
	// Allowlist is the inline lines, normalised and de-duplicated, in file
	// order: a name without rules once, a name with rules once per rule;
	// no name is both. Entry.Line is the abox.yaml line of the item.
	Allowlist     []allowlist.Line
	AllowlistFile string
	// Ports are the proxy's destination ports; nil is the default 80, 443.
	Ports        []uint16
	AllowPrivate []netip.Prefix
	// Passive is the passive (record-only) filter mode.
	Passive        bool
	NoMITM         bool
	MITMExceptions []string
	Upstreams      []string
	// UpstreamProxy is the parent proxy URL, or nil.
	UpstreamProxy *url.URL
	// ProxyCredentials is a host path (not confined to the project: the
	// secret lives with the user), or empty.
	ProxyCredentials string
	UpstreamCA       string
	Monitor          bool
	// MonitorBundle is a bundle file inside the project, "release", or "".
	MonitorBundle string
	Template      string
	Overlay       string
	Scripts       []string
	Forwards      []Forward
	// Secrets are the secret bindings, in file order; no secret is bound
	// to one host and port twice.
	Secrets []Secret
	// Warnings are accepted values that deserve a second look (a range
	// wider than a site); the trust prompt shows them.
	Warnings []string
}

// Forward is a host-loopback to guest forward.
type Forward struct{ HostPort, GuestPort uint16 }

func (f Forward) String() string { return fmt.Sprintf("%d:%d", f.HostPort, f.GuestPort) }

// Validate checks every value and applies the defaults.
func (d *Doc) Validate() (Config, error) {
	f := d.File
	c := Config{
		Name: f.Name, Base: f.Base, Accel: f.Accel,
		CPUs: DefaultCPUs, MemoryMiB: DefaultMemoryMiB, DiskGiB: DefaultDiskGiB,
	}
	if c.Name == "" {
		return Config{}, &Error{Source: d.Source, Msg: "name: required (the instance name, such as `name: dev`)"}
	}
	if err := validate.InstanceName(f.Name); err != nil {
		return Config{}, d.errAt("name", "%v", err)
	}
	if c.Base == "" {
		c.Base = DefaultBase
	} else if err := validate.InstanceName(c.Base); err != nil {
		return Config{}, d.errAt("base", "not an image name: %v", err)
	}
	var err error
	if c.CPUs, err = d.bounded("cpus", f.CPUs, DefaultCPUs, MaxCPUs); err != nil {
		return Config{}, err
	}
	if c.MemoryMiB, err = d.bounded("memory", f.Memory, DefaultMemoryMiB, MaxMemoryMiB); err != nil {
		return Config{}, err
	}
	if f.Memory != 0 && f.Memory < 256 {
		return Config{}, d.errAt("memory", "%d MiB is too little for a guest (memory is in MiB; at least 256)", f.Memory)
	}
	if c.DiskGiB, err = d.bounded("disk", f.Disk, DefaultDiskGiB, MaxDiskGiB); err != nil {
		return Config{}, err
	}
	switch c.Accel {
	case "":
		c.Accel = DefaultAccel
	case "kvm", "tcg", "auto":
	default:
		return Config{}, d.errAt("accel", "%q: want kvm, tcg or auto", c.Accel)
	}
	if len(f.Allowlist) > MaxEntries {
		return Config{}, d.errAt("allowlist", "%d entries; at most %d (use allowlist_file for long lists)", len(f.Allowlist), MaxEntries)
	}
	if c.Allowlist, err = d.allowlistLines(f.Allowlist); err != nil {
		return Config{}, err
	}
	if c.AllowlistFile, err = d.local("allowlist_file", f.AllowlistFile); err != nil {
		return Config{}, err
	}
	for i, p := range f.Ports {
		if p < 1 || p > 65535 {
			return Config{}, d.errAt(fmt.Sprintf("ports[%d]", i), "%d is not a port (1-65535)", p)
		}
		c.Ports = append(c.Ports, uint16(p))
	}
	for i, s := range f.AllowPrivate {
		// The same parse as --allow-private: a /0 is refused, an
		// IPv4-mapped range is its IPv4 one.
		p, warning, err := netclass.ParsePermit("allow_private", s)
		if err != nil {
			return Config{}, d.errAt(fmt.Sprintf("allow_private[%d]", i), "%v", err)
		}
		c.AllowPrivate = append(c.AllowPrivate, p)
		if warning != "" {
			c.Warnings = append(c.Warnings, warning)
		}
	}
	switch f.Mode {
	case "", "active":
	case "passive":
		c.Passive = true
	default:
		return Config{}, d.errAt("mode", "%q: want active or passive", f.Mode)
	}
	c.NoMITM = f.MITM.Enabled != nil && !*f.MITM.Enabled
	for i, h := range f.MITM.Exceptions {
		e, err := allowlist.ParseEntry(h)
		if err != nil || e.Wildcard {
			return Config{}, d.errAt(fmt.Sprintf("mitm.exceptions[%d]", i), "%q: want a host name", h)
		}
		c.MITMExceptions = append(c.MITMExceptions, e.Name)
	}
	if l, err := allowlist.NewLines(c.Allowlist); err == nil {
		if msg := c.tunnelledRules(l); msg != "" {
			return Config{}, d.errAt("allowlist", "%s", msg)
		}
	}
	for i, u := range f.DNS.Upstreams {
		if _, err := netip.ParseAddrPort(u); err != nil {
			if _, err := netip.ParseAddr(u); err != nil {
				return Config{}, d.errAt(fmt.Sprintf("dns.upstreams[%d]", i), "%q: want an IP or IP:PORT", u)
			}
		}
		c.Upstreams = append(c.Upstreams, u)
	}
	if f.UpstreamProxy.URL != "" {
		u, err := url.Parse(f.UpstreamProxy.URL)
		if err != nil || u.Scheme != "http" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return Config{}, d.errAt("upstream_proxy.url", "%q: want http://HOST:PORT", f.UpstreamProxy.URL)
		}
		if u.User != nil {
			return Config{}, d.errAt("upstream_proxy.url", "credentials do not belong in the URL; put USER:PASSWORD in a file and name it in upstream_proxy.credentials_file")
		}
		c.UpstreamProxy = u
	}
	if f.UpstreamProxy.CredentialsFile != "" {
		if f.UpstreamProxy.URL == "" {
			return Config{}, d.errAt("upstream_proxy.credentials_file", "set without upstream_proxy.url")
		}
		c.ProxyCredentials = f.UpstreamProxy.CredentialsFile
	}
	if c.UpstreamCA, err = d.local("upstream_ca", f.UpstreamCA); err != nil {
		return Config{}, err
	}
	c.Monitor = f.Monitor.Enabled
	if f.Monitor.Bundle == "release" {
		c.MonitorBundle = f.Monitor.Bundle
	} else if c.MonitorBundle, err = d.local("monitor.bundle", f.Monitor.Bundle); err != nil {
		return Config{}, err
	}
	if c.MonitorBundle != "" {
		c.Monitor = true
	}
	if c.Template, err = d.local("overrides.libvirt.template", f.Overrides.Libvirt.Template); err != nil {
		return Config{}, err
	}
	if c.Overlay, err = d.local("provision.overlay", f.Provision.Overlay); err != nil {
		return Config{}, err
	}
	if len(f.Provision.Scripts) > MaxScripts {
		return Config{}, d.errAt("provision.scripts", "%d scripts; at most %d", len(f.Provision.Scripts), MaxScripts)
	}
	for i, s := range f.Provision.Scripts {
		p, err := d.local(fmt.Sprintf("provision.scripts[%d]", i), s)
		if err != nil {
			return Config{}, err
		}
		if p == "" {
			return Config{}, d.errAt(fmt.Sprintf("provision.scripts[%d]", i), "empty script path")
		}
		c.Scripts = append(c.Scripts, p)
	}
	if len(f.Forwards) > MaxForwards {
		return Config{}, d.errAt("forwards", "%d forwards; at most %d", len(f.Forwards), MaxForwards)
	}
	hostPorts := map[uint16]bool{}
	for i, s := range f.Forwards {
		key := fmt.Sprintf("forwards[%d]", i)
		h, g, ok := strings.Cut(s, ":")
		hp, err1 := strconv.ParseUint(h, 10, 16)
		gp, err2 := strconv.ParseUint(g, 10, 16)
		if !ok || err1 != nil || err2 != nil || hp == 0 || gp == 0 {
			return Config{}, d.errAt(key, "%q: want HOSTPORT:GUESTPORT such as \"8080:80\" (reverse forwards cannot be declared in abox.yaml)", s)
		}
		if err := validate.ForwardHostPort(uint16(hp)); err != nil {
			return Config{}, d.errAt(key, "%v", err)
		}
		if hostPorts[uint16(hp)] {
			return Config{}, d.errAt(key, "host port %d is forwarded twice", hp)
		}
		hostPorts[uint16(hp)] = true
		c.Forwards = append(c.Forwards, Forward{HostPort: uint16(hp), GuestPort: uint16(gp)})
	}
	if c.Secrets, err = d.secretList(c.Name, f.Secrets); err != nil {
		return Config{}, err
	}
	return c, nil
}

// allowlistLines validates the allowlist items into lines. Every error
// names the item (allowlist[i], or allowlist[i].rules[j]) and so its line.
func (d *Doc) allowlistLines(items []AllowlistItem) ([]allowlist.Line, error) {
	var out []allowlist.Line
	seen := map[string]bool{}
	// ruled records, by entry, whether its first item had rules and where
	// it was, to refuse a name listed both ways at the second item.
	type first struct {
		ruled bool
		key   string
	}
	firsts := map[string]first{}
	total := 0
	for i, it := range items {
		key := fmt.Sprintf("allowlist[%d]", i)
		var lines []allowlist.Line
		if !it.mapping {
			ln, err := allowlist.ParseLine(it.Line)
			if err != nil {
				return nil, d.errAt(key, "%v", err)
			}
			lines = append(lines, ln)
		} else {
			if it.Host == "" {
				return nil, d.errAt(key, "no host; write `host: NAME` with its rules, or the item as a string (- example.com)")
			}
			e, err := allowlist.ParseEntry(it.Host)
			if err != nil {
				return nil, d.errAt(key+".host", "%v", err)
			}
			if _, given := d.pos[key+".rules"]; given && len(it.Rules) == 0 {
				return nil, d.errAt(key+".rules", "no rules; leave rules out to allow everything on %s, or list them (\"GET,HEAD /**\")", e)
			}
			for j, rs := range it.Rules {
				ln, err := allowlist.ParseLine(e.String() + " " + rs)
				if err == nil && ln.Rule == nil {
					err = errors.New("an empty rule; a rule is [METHOD[,METHOD...]] [PATTERN] [audit]")
				}
				if err != nil {
					return nil, d.errAt(fmt.Sprintf("%s.rules[%d]", key, j), "%v", err)
				}
				lines = append(lines, ln)
			}
			if it.Audit {
				ln, err := allowlist.ParseLine(e.String() + " " + reqrules.AuditWord)
				if err != nil {
					return nil, d.errAt(key+".audit", "%v", err)
				}
				lines = append(lines, ln)
			}
			if len(lines) == 0 {
				lines = append(lines, allowlist.Line{Entry: e})
			}
		}
		for _, ln := range lines {
			name := ln.Entry.String()
			ruled := ln.Rule != nil
			if f, ok := firsts[name]; ln.Push != nil {
				// A push line goes with a name listed with rules or without.
			} else if !ok {
				firsts[name] = first{ruled, key}
			} else if f.ruled != ruled {
				with, without := f.key, key
				if ruled {
					with, without = key, f.key
				}
				return nil, d.errAt(key, "%s is listed with rules at %s (line %d) and without rules at %s (line %d); without rules it allows everything on the host, so the rules would not count: drop the rules or the item without them", name, with, d.pos[with].line, without, d.pos[without].line)
			}
			if seen[ln.String()] {
				continue
			}
			seen[ln.String()] = true
			if total++; total > MaxEntries {
				return nil, d.errAt("allowlist", "more than %d lines; at most %d (use allowlist_file for long lists)", MaxEntries, MaxEntries)
			}
			ln.Entry.Line = d.pos[key].line
			out = append(out, ln)
		}
	}
	if _, err := allowlist.NewLines(out); err != nil {
		// Bounds the builder keeps (rules per name) that the loop does not.
		return nil, d.errAt("allowlist", "%v", err)
	}
	return out, nil
}

// tunnelledRules says which entry with rules decides a host the proxy
// tunnels unseen (mitm.enabled: false, mitm.exceptions), where its rules
// could not be enforced; "" when none does.
func (c Config) tunnelledRules(l *allowlist.List) string {
	r := l.Restricted()
	if len(r) == 0 {
		return ""
	}
	if c.NoMITM {
		return fmt.Sprintf("%s has rules, but mitm.enabled is false: HTTPS is tunnelled unseen, so no rule could be checked; turn interception on or drop the rules", r[0])
	}
	for _, h := range c.MITMExceptions {
		if dn := l.MatchNormalized(h); dn.Verdict == allowlist.Allow && (l.Rules(dn.Rule) != nil || l.Push(dn.Rule) != nil) {
			return fmt.Sprintf("%s has rules, but %s is in mitm.exceptions: it is tunnelled unseen, so no rule could be checked; drop the exception or the rules", dn.Rule, h)
		}
	}
	return ""
}

func (d *Doc) bounded(key string, v, def, limit int) (uint, error) {
	switch {
	case v == 0:
		return uint(def), nil
	case v < 0 || v > limit:
		return 0, d.errAt(key, "%d is out of range (1-%d)", v, limit)
	}
	return uint(v), nil
}

// local checks that p names a file inside the project directory: relative,
// without "..", not empty after cleaning. Symbolic links that leave the
// directory are refused later, when the file is opened through os.Root.
func (d *Doc) local(key, p string) (string, error) {
	if p == "" {
		return "", nil
	}
	if !filepath.IsLocal(p) {
		return "", d.errAt(key, "%q must be a relative path inside the project directory (no absolute path, no ..)", p)
	}
	return filepath.Clean(p), nil
}
