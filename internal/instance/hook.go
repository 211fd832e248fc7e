package instance

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
)

// A guest started without abox (virsh start, libvirt's autostart, a host
// reboot followed by someone starting the network and the domain) would
// run without the host chains and without the filters: libvirt knows
// nothing of either. So abox installs a libvirt qemu hook: libvirtd runs
// it before it starts any domain ("prepare begin"), as root, with the
// domain's XML on standard input, and a non-zero exit stops the start.
// For a domain whose metadata says it is abox's, the hook refuses unless
// the instance's host chains are intact (Firewall.Check) and its filter
// daemon answers. Every start that the hook allows leaves a stamp in the
// instance's run directory; `abox start` checks that the stamp is fresh,
// so a libvirtd that does not run hooks (one started before the hook was
// installed: libvirt looks for hooks only when it starts) is noticed at
// once instead of leaving the protection silently off.

// EnvHooksDir overrides DefaultHooksDir (tests run a libvirtd whose
// configuration lives elsewhere).
const EnvHooksDir = "ABOX_LIBVIRT_HOOKS"

// DefaultHooksDir is libvirt's hook directory on Debian.
const DefaultHooksDir = "/etc/libvirt/hooks"

// HookFile is abox's hook inside the hooks directory: libvirt (6.5 and
// later) runs every executable in qemu.d/, so abox never overwrites a
// hooks/qemu script of the administrator's.
const HookFile = "qemu.d/abox"

// hookStampFile is written in the run directory by every start the hook
// allows.
const hookStampFile = "hook-allowed"

// HooksDir is the hooks directory in use.
func HooksDir() string {
	if d := os.Getenv(EnvHooksDir); d != "" {
		return d
	}
	return DefaultHooksDir
}

// HookScript is the hook abox installs. It does nothing for other
// domains and other operations; for an abox domain it hands the XML to
// `abox libvirt-hook`, and fails closed if that binary is gone.
func HookScript(exe string) string {
	return `#!/bin/sh
# Installed by abox: refuses to start an abox guest whose host chains or
# filters are not up. See abox's docs/hostfw.md.
case "$1" in
` + libvirt.ObjectPrefix + `*) ;;
*) exit 0 ;;
esac
[ "$2" = prepare ] && [ "$3" = begin ] || exit 0
exec ` + shellQuote(exe) + ` libvirt-hook "$@"
`
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// InstallHook writes the hook into dir (atomically, 0755) unless it is
// there already with the same content. It reports whether it wrote.
func InstallHook(dir, exe string) (bool, error) {
	path := filepath.Join(dir, HookFile)
	want := []byte(HookScript(exe))
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, fmt.Errorf("installing the libvirt hook: %w", err)
	}
	if err := fsutil.WriteFileAtomic(path, want, 0o755); err != nil {
		return false, fmt.Errorf("installing the libvirt hook: %w", err)
	}
	return true, nil
}

// hookMetadata is the part of abox's <metadata> the hook reads.
type hookMetadata struct {
	Name string `xml:"name,attr"`
	Dir  string `xml:"dir,attr"`
}

type hookDomain struct {
	Name     string `xml:"name"`
	Metadata struct {
		Instances []struct {
			XMLName xml.Name
			hookMetadata
		} `xml:",any"`
	} `xml:"metadata"`
}

// instanceOfDomain finds the instance a domain XML belongs to, validating
// the metadata like user input: the directory must be
// <root>/instances/<name> for the domain's own name.
func instanceOfDomain(domainXML []byte) (paths.Layout, string, error) {
	var d hookDomain
	if err := xml.Unmarshal(domainXML, &d); err != nil {
		return paths.Layout{}, "", fmt.Errorf("reading the domain XML: %w", err)
	}
	name, ok := strings.CutPrefix(d.Name, libvirt.ObjectPrefix)
	if !ok {
		return paths.Layout{}, "", fmt.Errorf("domain %q is not abox's", d.Name)
	}
	for _, m := range d.Metadata.Instances {
		if m.XMLName.Space != libvirt.MetadataNamespace {
			continue
		}
		if m.Name != name {
			return paths.Layout{}, "", fmt.Errorf("domain %s: its abox metadata names instance %q", d.Name, m.Name)
		}
		dir := m.Dir
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || filepath.Base(dir) != name || filepath.Base(filepath.Dir(dir)) != "instances" {
			return paths.Layout{}, "", fmt.Errorf("domain %s: its abox metadata gives the directory %q, want <root>/instances/%s", d.Name, dir, name)
		}
		return paths.Layout{Root: filepath.Dir(filepath.Dir(dir))}, name, nil
	}
	return paths.Layout{}, "", fmt.Errorf("domain %s has no abox metadata with its directory (defined by an older abox? run `abox start %s` once)", d.Name, name)
}

// HookChecker is what the hook looks at.
type HookChecker struct {
	Firewall interface {
		Check(ctx context.Context, b hostfw.Bridge) (hostfw.Status, error)
	}
	// Timeout bounds the daemon probe; 0 means 3s.
	Timeout time.Duration
}

// RunHook is the body of `abox libvirt-hook DOMAIN prepare begin -`: it
// allows the start (nil) only when the instance's host chains are intact
// and its filter daemon answers, and then writes the stamp.
func (h HookChecker) RunHook(ctx context.Context, domainXML io.Reader) error {
	b, err := io.ReadAll(io.LimitReader(domainXML, 4<<20))
	if err != nil {
		return fmt.Errorf("abox hook: reading the domain XML: %w", err)
	}
	l, name, err := instanceOfDomain(b)
	if err != nil {
		return fmt.Errorf("abox hook: %w", err)
	}
	st, err := Load(l, name)
	if err != nil {
		return fmt.Errorf("abox hook: refusing to start %s: %w", name, err)
	}
	var problems []string
	fw, err := h.Firewall.Check(ctx, FirewallBridge(st))
	if err != nil {
		problems = append(problems, err.Error())
	}
	problems = append(problems, fw.Problems...)
	if err := h.daemonAnswers(ctx, l, name); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("abox hook: refusing to start %s outside abox: %s; start it with `abox start %s`", name, strings.Join(problems, "; "), name)
	}
	f := l.Instance(name)
	if err := fsutil.WriteFileAtomic(filepath.Join(f.RunDir, hookStampFile), []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), PrivateFile); err != nil {
		return fmt.Errorf("abox hook: %w", err)
	}
	return nil
}

func (h HookChecker) daemonAnswers(ctx context.Context, l paths.Layout, name string) error {
	timeout := h.Timeout
	if timeout == 0 {
		timeout = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s, err := api.NewClient(l.Instance(name).APISocket).Status(ctx)
	if err != nil {
		return fmt.Errorf("the filter daemon does not answer (%v)", err)
	}
	if s.Components["dns"] == nil || s.Components["http"] == nil {
		return errors.New("the filter daemon runs without its DNS filter or proxy")
	}
	return nil
}

// hookRanSince reports whether the hook allowed a start of name at or
// after t.
func hookRanSince(l paths.Layout, name string, t time.Time) (bool, error) {
	b, err := os.ReadFile(filepath.Join(l.Instance(name).RunDir, hookStampFile))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	if err != nil {
		return false, nil
	}
	return !at.Before(t.Add(-time.Second)), nil
}
