// Package instance orchestrates an instance's life: create, start, stop and
// remove, composing the hypervisor, the host firewall, the image store and
// the filter daemon, and rolling back partial work on failure.
package instance

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

// StateFile is the state's file name inside the instance directory.
const StateFile = paths.StateFile

// Default resource and network settings.
const (
	DefaultCPUs      = 2
	DefaultMemoryMiB = 1024
	DefaultDiskGiB   = 10
	DefaultUser      = "abox"
	DefaultProxyPort = 28128 // not 3128 (squid) or any port a common host service listens on
	// CaptureHTTPPort and CaptureTLSPort are the proxy's capture ports on
	// the gateway: the host takes the guest's TCP to port 80 and 443 of
	// any other address there (hostfw, docs/hostfw.md), so that clients
	// that ignore the proxy settings are filtered as if they used it.
	CaptureHTTPPort = 28180
	CaptureTLSPort  = 28443
	DefaultPool     = "10.10.0.0/16"
)

// State is an instance's persistent definition. It is written atomically and
// only under the instance lock.
type State struct {
	Name      string    `json:"name"`
	UUID      string    `json:"uuid"`
	CreatedAt time.Time `json:"created_at"`

	Base      string `json:"base"`
	CPUs      uint   `json:"cpus"`
	MemoryMiB uint   `json:"memory_mib"`
	DiskGiB   uint   `json:"disk_gib"`
	User      string `json:"user"`
	// Accel is the decided accelerator ("kvm" or "tcg"), never "auto".
	Accel string `json:"accel"`

	Subnet  netip.Prefix `json:"subnet"`
	Gateway netip.Addr   `json:"gateway"`
	GuestIP netip.Addr   `json:"guest_ip"`
	Bridge  string       `json:"bridge"`
	MAC     string       `json:"mac"`

	ProxyPort uint16 `json:"proxy_port"`
	// Upstreams are the resolvers the filters use; empty means the host's.
	Upstreams []string `json:"upstreams,omitempty"`
	// AllowPrivate are address ranges the filters may let the guest reach.
	AllowPrivate []netip.Prefix `json:"allow_private,omitempty"`
	// AllowHost are ranges the guest may reach although they hold host
	// addresses, loopback or other instances' networks (create --allow-host).
	AllowHost []netip.Prefix `json:"allow_host,omitempty"`
	// NoMITM turns TLS interception off (CONNECT becomes a checked tunnel).
	NoMITM         bool     `json:"no_mitm,omitempty"`
	MITMExceptions []string `json:"mitm_exceptions,omitempty"`
	// Ports are the destination ports the proxy allows; empty means 80, 443.
	Ports []uint16 `json:"ports,omitempty"`
	// UpstreamCA is a PEM bundle the proxy trusts for origins besides the
	// system roots (a copy inside the instance directory), or empty.
	UpstreamCA string `json:"upstream_ca,omitempty"`
	// UpstreamProxy is the parent proxy (http://HOST:PORT) the filters'
	// egress goes through, or empty; UpstreamProxyCredentials is the host
	// file with its USER:PASSWORD, read at every filter start.
	UpstreamProxy            string `json:"upstream_proxy,omitempty"`
	UpstreamProxyCredentials string `json:"upstream_proxy_credentials,omitempty"`
	// MetricsListen is a loopback IP:PORT on which the filters also serve
	// GET /metrics for a scraper (daemon.Config.MetricsListen), or empty.
	MetricsListen string `json:"metrics_listen,omitempty"`
	// Monitor: the guest has the runtime monitor's channel and forwarder,
	// and start runs the host-side monitor process.
	Monitor bool `json:"monitor,omitempty"`
	// MonitorBundle is the Tetragon bundle abox installs in the guest
	// (create --monitor-bundle), or nil: then only the forwarder runs.
	MonitorBundle *MonitorBundle `json:"monitor_bundle,omitempty"`
	// Template is a user domain template that replaces the hardened domain.
	Template string `json:"template,omitempty"`
	// Kernel boot of the base image, copied at create so the instance does
	// not change when the base is re-imported.
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
}

// ErrNotFound means no instance of that name exists.
var ErrNotFound = errors.New("no such instance")

// Load reads an instance's state.
func Load(l paths.Layout, name string) (State, error) {
	if err := validate.InstanceName(name); err != nil {
		return State{}, err
	}
	b, err := os.ReadFile(l.Instance(name).State)
	if errors.Is(err, fs.ErrNotExist) {
		return State{}, fmt.Errorf("instance %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return State{}, fmt.Errorf("reading instance %s: %w", name, err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("reading instance %s: %s is damaged (%w: %w); remove it with `abox remove --force %s`", name, StateFile, ErrDamaged, err, name)
	}
	if s.Name != name {
		return State{}, fmt.Errorf("reading instance %s: %s is damaged (%w: it names %q); remove it with `abox remove --force %s`", name, StateFile, ErrDamaged, s.Name, name)
	}
	if err := s.validate(l); err != nil {
		return State{}, fmt.Errorf("reading instance %s: %s is damaged: %w (remove it with `abox remove --force %s`)", name, StateFile, err, name)
	}
	return s, nil
}

// ErrDamaged is wrapped when an instance's state fails validation.
var ErrDamaged = errors.New("invalid state")

// validate checks state read from disk like user input: everything that
// reaches libvirt, iptables or the filesystem must be what abox itself
// would have written (a hand-edited or corrupted file must not become a
// bridge name in an iptables rule or a host path in a domain).
func (s State) validate(l paths.Layout) error {
	var errs []error
	if err := ParamsOf(l, s).Validate(); err != nil {
		errs = append(errs, err)
	}
	if want, err := validate.BridgeName(s.Name); err == nil && s.Bridge != want {
		errs = append(errs, fmt.Errorf("bridge %q, want %q", s.Bridge, want))
	}
	if s.Accel != "kvm" && s.Accel != "tcg" {
		errs = append(errs, fmt.Errorf("accel %q", s.Accel))
	}
	dir := l.Instance(s.Name).Dir
	if s.UpstreamCA != "" && s.UpstreamCA != filepath.Join(dir, "upstream-ca.pem") {
		errs = append(errs, fmt.Errorf("upstream CA %q is not the instance's copy", s.UpstreamCA))
	}
	// The kernel and initrd are the base image's, or an imported
	// instance's own copies (abox import carries them).
	f := l.Instance(s.Name)
	for _, k := range []struct{ what, path, own string }{{"kernel", s.Kernel, f.Kernel}, {"initrd", s.Initrd, f.Initrd}} {
		if k.path != "" && k.path != k.own && !fsutil.Within(k.path, l.Images()) {
			errs = append(errs, fmt.Errorf("%s %q is not in the image store %s nor the instance's own copy", k.what, k.path, l.Images()))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrDamaged, err)
	}
	return nil
}

// Save writes the state atomically.
func Save(l paths.Layout, s State) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("saving instance %s: %w", s.Name, err)
	}
	return fsutil.WriteFileAtomic(l.Instance(s.Name).State, append(b, '\n'), PrivateFile)
}

// ListStates returns every instance, sorted by name.
func ListStates(l paths.Layout) ([]State, error) {
	out, _, err := listStates(l)
	return out, err
}

// listStates returns the valid instances sorted by name, and the names of
// damaged ones with the reason: one bad file must not make every other
// instance unlistable or block creating new ones (a damaged instance's
// network stays defined in libvirt, so its subnet is still seen as taken).
func listStates(l paths.Layout) ([]State, map[string]error, error) {
	entries, err := os.ReadDir(l.Instances())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("listing instances: %w", err)
	}
	var out []State
	damaged := map[string]error{}
	for _, e := range entries {
		if !e.IsDir() || validate.InstanceName(e.Name()) != nil {
			continue
		}
		s, err := Load(l, e.Name())
		switch {
		case errors.Is(err, ErrNotFound):
			continue // a creation in progress, or a standalone filter's directory
		case errors.Is(err, ErrDamaged):
			damaged[e.Name()] = err
			continue
		case err != nil:
			return nil, nil, err
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, damaged, nil
}

// lockFile takes an exclusive flock on path, creating it. The lock is held
// until the returned function is called (or the process dies, so a crash
// never leaves a stale lock).
func lockFile(path string) (func(), error) { return lockFileNotify(path, nil) }

// lockFileNotify is lockFile that calls busy, when not nil, before it
// waits for another holder.
func lockFileNotify(path string, busy func()) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, PrivateFile)
	if err != nil {
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if busy != nil {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if errors.Is(err, syscall.EWOULDBLOCK) {
			busy()
		}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// globalLock serialises allocation of names, subnets, bridges and MACs.
func globalLock(l paths.Layout) (func(), error) {
	if err := os.MkdirAll(l.Root, 0o711); err != nil {
		return nil, fmt.Errorf("locking %s: %w", l.Root, err)
	}
	return lockFile(filepath.Join(l.Root, ".lock"))
}

// lockInstance takes the instance's lock. An instance without a directory
// does not exist: the lock is not created for it (that would leave an
// empty directory behind a typo).
func lockInstance(l paths.Layout, name string) (func(), error) {
	return lockInstanceNotify(l, name, nil)
}

// lockInstanceNotify is lockInstance that calls busy before it waits for
// another command holding the lock (a start, stop or remove in progress).
func lockInstanceNotify(l paths.Layout, name string, busy func()) (func(), error) {
	if err := validate.InstanceName(name); err != nil {
		return nil, err
	}
	f := l.Instance(name)
	if _, err := os.Stat(f.Dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("instance %s: %w", name, ErrNotFound)
	}
	return lockFileNotify(f.Lock, busy)
}

// MonitorBundle is a checked Tetragon bundle in the host's agent cache.
type MonitorBundle struct {
	// SHA256 of the tarball; the guest checks what arrives against it.
	SHA256 string `json:"sha256"`
	// Source is what the user gave: a file, or "release vX" for the pinned
	// upstream release.
	Source string `json:"source"`
	// Path is the cached copy (paths.Layout.AgentCache).
	Path string `json:"path"`
	// Prefix is the top directory the layout sits below, or "".
	Prefix     string `json:"prefix,omitempty"`
	Size       int64  `json:"size"`
	BPFObjects int    `json:"bpf_objects"`
}
