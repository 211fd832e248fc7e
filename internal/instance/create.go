package instance

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/steps"
	"github.com/abox-dev/abox/internal/tetragon"
	"github.com/abox-dev/abox/internal/validate"
)

// Spec is what a user asks for at create. Zero values take defaults.
type Spec struct {
	Name      string
	Base      string
	CPUs      uint
	MemoryMiB uint
	DiskGiB   uint
	User      string
	// Accel is "kvm", "tcg" or "auto" (default).
	Accel string
	// Subnet is an explicit /24; zero means allocate from the pool.
	Subnet       netip.Prefix
	Upstreams    []string
	AllowPrivate []netip.Prefix
	// AllowHost are the --allow-host ranges (see State.AllowHost).
	AllowHost []netip.Prefix
	// Allowlist is an optional file whose entries seed the instance's list.
	Allowlist      string
	NoMITM         bool
	MITMExceptions []string
	Ports          []uint16
	// Template is an optional domain template file (replaces hardened defaults).
	Template string
	// UpstreamCA is an optional PEM file of extra roots for origin TLS.
	UpstreamCA string
	// UpstreamProxy is an optional parent proxy http://HOST:PORT, with its
	// USER:PASSWORD in the file UpstreamProxyCredentials (optional).
	UpstreamProxy            string
	UpstreamProxyCredentials string
	// MetricsListen is an optional loopback IP:PORT for a metrics scraper.
	MetricsListen string
	// Monitor gives the guest the runtime monitor: a virtio-serial channel
	// to the host and the forwarder that streams Tetragon's events into it
	// (abox.yaml's monitor.enabled).
	Monitor bool
	// MonitorBundle is a Tetragon bundle file to install in the guest, or
	// BundleRelease for the pinned upstream release (downloaded over https
	// into the host's agent cache and verified); it implies Monitor.
	MonitorBundle string
	// MonitorBundleSource names MonitorBundle in the state and messages
	// when it is a copy (abox up copies the project's file); empty is the
	// file's absolute path.
	MonitorBundleSource string
}

// BundleRelease as Spec.MonitorBundle means the pinned upstream release.
const BundleRelease = "release"

// SeedInput is what the cloud-init seed needs beyond the state.
type SeedInput struct {
	State         State
	AuthorizedKey string // "ssh-ed25519 AAAA... comment"
	CACertPEM     []byte
	// HostKey is the guest's ssh host key, generated here so that the
	// first connection is already verified (known_hosts is written at create).
	HostKeyPEM    []byte
	HostPublicKey string
	// Placeholders are the guest's secret placeholders, NAME and
	// "abox-ph-..." (secrets.Store.Placeholders): never a value.
	Placeholders [][2]string
}

// SeedWriter writes the NoCloud seed ISO at path.
type SeedWriter interface {
	WriteSeed(ctx context.Context, path string, in SeedInput) error
}

// Create defines a new instance: a list of steps (see internal/steps),
// each with its undo. On any failure everything it made is undone.
func (m *Manager) Create(ctx context.Context, spec Spec) (st State, warnings []string, err error) {
	if err := validate.InstanceName(spec.Name); err != nil {
		return State{}, nil, err
	}
	c := &creation{m: m, spec: spec}
	defer c.release()
	if _, err := m.runSteps(ctx, "creating "+spec.Name, c.steps()); err != nil {
		return State{}, nil, err
	}
	return c.st, c.warnings, nil
}

// creation is one Create in progress: what its steps made so far.
type creation struct {
	m    *Manager
	spec Spec
	f    paths.Instance
	base image.Image

	seedEntries []string
	upstreamCA  []byte // the --upstream-ca file's PEM, nil without one
	bundle      *MonitorBundle
	template    string
	unlock      func() // the global lock's release, once taken

	st       State
	in       SeedInput
	warnings []string
}

func (c *creation) release() {
	if c.unlock != nil {
		c.unlock()
	}
}

func (c *creation) steps() []steps.Step {
	m := c.m
	list := []steps.Step{
		{Name: "check the settings", Do: c.checkSpec},
		{Name: "monitor bundle", Do: func(ctx context.Context) (err error) {
			if c.spec.MonitorBundle != "" {
				c.spec.Monitor = true
				c.bundle, err = m.monitorBundle(ctx, c.spec.MonitorBundle, c.spec.MonitorBundleSource)
			}
			return err
		}},
		{Name: "take the global lock", Do: func(context.Context) (err error) {
			c.unlock, err = globalLock(m.Layout)
			return err
		}},
		{Name: "check the name", Do: c.checkName},
		{Name: "allocate addresses", Do: c.allocate},
		// The undo is the directory's, whatever the later steps put in it;
		// it is taken once the path is known to be free, before anything
		// is made there.
		{Name: "reserve the instance directory", Do: c.reserveDir,
			Undo: func(context.Context) error { return os.RemoveAll(c.f.Dir) }},
		{Name: "instance directories", Do: c.makeDirs},
		{Name: "ssh keys", Do: c.sshKeys},
		{Name: "instance CA", Do: func(context.Context) error {
			authority, err := ca.New(ca.Config{Dir: c.f.CADir})
			if err == nil {
				c.in.CACertPEM, err = authority.CertPEM()
			}
			if err != nil {
				return fmt.Errorf("instance CA: %w", err)
			}
			return nil
		}},
		{Name: "allowlist", Do: c.writeLists},
		{Name: "disk overlay", Do: c.diskOverlay},
		{Name: "cloud-init seed", Do: func(ctx context.Context) error {
			if err := m.Seeds.WriteSeed(ctx, c.f.Seed, c.in); err != nil {
				return fmt.Errorf("cloud-init seed: %w", err)
			}
			// The public halves too: one rule (0600) for every file is one a
			// test can check, and nothing but abox reads them.
			for _, p := range []string{c.f.Seed, c.f.SSHKey + ".pub", filepath.Join(c.f.CADir, ca.CertFile)} {
				if err := os.Chmod(p, PrivateFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return err
				}
			}
			return nil
		}},
	}
	list = append(list, m.defineSteps(&c.st, &c.warnings)...)
	return append(list, steps.Step{Name: "save the state", Do: func(context.Context) error { return Save(m.Layout, c.st) }})
}

// checkSpec takes the defaults and reads and checks every file the spec
// names; nothing is made yet.
func (c *creation) checkSpec(ctx context.Context) (err error) {
	if c.spec, err = withDefaults(c.spec); err != nil {
		return err
	}
	spec := &c.spec
	if c.base, err = c.m.Images.Get(spec.Base); err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return &BaseMissingError{Base: spec.Base}
		}
		return err
	}
	if spec.Allowlist != "" {
		if c.seedEntries, err = readAllowlist(spec.Allowlist); err != nil {
			return err
		}
	}
	if spec.UpstreamCA != "" {
		if c.upstreamCA, err = os.ReadFile(spec.UpstreamCA); err != nil {
			return fmt.Errorf("reading upstream CA bundle: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(c.upstreamCA) {
			return fmt.Errorf("upstream CA bundle %s holds no PEM certificate", spec.UpstreamCA)
		}
	}
	if spec.MetricsListen != "" {
		if _, err := daemon.ParseMetricsListen(spec.MetricsListen); err != nil {
			return err
		}
	}
	if spec.UpstreamProxy != "" {
		if _, err := egress.NewParentProxy(spec.UpstreamProxy, spec.UpstreamProxyCredentials); err != nil {
			return err
		}
		if spec.UpstreamProxyCredentials != "" {
			if spec.UpstreamProxyCredentials, err = filepath.Abs(spec.UpstreamProxyCredentials); err != nil {
				return err
			}
		}
	} else if spec.UpstreamProxyCredentials != "" {
		return errors.New("upstream proxy credentials without an upstream proxy")
	}
	if spec.Template != "" {
		b, err := os.ReadFile(spec.Template)
		if err != nil {
			return fmt.Errorf("reading domain template: %w", err)
		}
		c.template = string(b)
	}
	return nil
}

// checkName refuses a name an instance or a libvirt domain has (under the
// global lock, so no other create takes it meanwhile).
func (c *creation) checkName(ctx context.Context) error {
	name := c.spec.Name
	c.f = c.m.Layout.Instance(name)
	if _, err := os.Stat(c.f.Dir); err == nil {
		if _, serr := os.Stat(c.f.State); serr == nil {
			return &NameTakenError{Name: name}
		}
		// A directory without state is an interrupted create; it holds
		// nothing of value (instances are only real once state is written).
		if err := os.RemoveAll(c.f.Dir); err != nil {
			return fmt.Errorf("clearing an interrupted create: %w", err)
		}
	}
	dom := libvirt.DomainName(name)
	if _, err := c.m.Hypervisor.State(ctx, dom); !errors.Is(err, libvirt.ErrNotFound) {
		if err != nil {
			return err
		}
		return &DomainTakenError{Name: name, Domain: dom}
	}
	return nil
}

// allocate builds the state and gives it a subnet, bridge and MAC no other
// instance has.
func (c *creation) allocate(ctx context.Context) (err error) {
	spec, base := c.spec, c.base
	c.st = State{
		Name: spec.Name, UUID: newUUID(), CreatedAt: time.Now().UTC(),
		Base: spec.Base, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB, DiskGiB: spec.DiskGiB,
		User: spec.User, Accel: resolveAccel(spec.Accel),
		ProxyPort: DefaultProxyPort, Upstreams: spec.Upstreams, AllowPrivate: spec.AllowPrivate, AllowHost: spec.AllowHost,
		NoMITM: spec.NoMITM, MITMExceptions: spec.MITMExceptions, Ports: spec.Ports, Monitor: spec.Monitor,
		MonitorBundle: c.bundle,
		Template:      c.template,
		UpstreamProxy: spec.UpstreamProxy, UpstreamProxyCredentials: spec.UpstreamProxyCredentials,
		MetricsListen: spec.MetricsListen,
		Kernel:        base.KernelPath(), Initrd: base.InitrdPath(),
	}
	st := &c.st
	if base.Boot != nil {
		st.Cmdline = base.Boot.Cmdline
	}
	if st.Subnet, err = c.m.allocateSubnet(ctx, spec.Subnet); err != nil {
		return err
	}
	st.Gateway, st.GuestIP = libvirt.InstanceAddresses(st.Subnet)
	if st.Bridge, err = c.m.allocateBridge(spec.Name); err != nil {
		return err
	}
	if st.MAC, err = c.m.allocateMAC(); err != nil {
		return err
	}
	c.m.progress("creating %s: subnet %s, bridge %s, accel %s", st.Name, st.Subnet, st.Bridge, st.Accel)
	return nil
}

// reserveDir makes the data directories QEMU traverses and checks that
// the instance's own is still free.
func (c *creation) reserveDir(context.Context) error {
	// QEMU runs as an unprivileged user: it must traverse the data root,
	// the instance directory and logs/ to its disk, seed and serial log,
	// and nothing more (see perms.go).
	for _, d := range []string{c.m.Layout.Root, c.m.Layout.Instances()} {
		// Directories we may not own: only add the search bits.
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
		fi, err := os.Stat(d)
		if err == nil && fi.Mode().Perm()&0o011 != 0o011 {
			err = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
		if err != nil {
			return err
		}
	}
	if _, err := os.Stat(c.f.Dir); err == nil {
		return fmt.Errorf("%s appeared meanwhile", c.f.Dir)
	}
	return nil
}

func (c *creation) makeDirs(context.Context) error {
	f := c.f
	for _, d := range []struct {
		path string
		qemu bool
	}{{f.Dir, true}, {f.LogsDir, true}, {filepath.Dir(f.SSHKey), false}, {f.RunDir, false}} {
		var err error
		if d.qemu {
			err = makeQEMUDir(d.path)
		} else {
			err = makePrivateDir(d.path)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// sshKeys makes the user's key and the guest's host key, and pins the
// host key, so that the first connection is already verified.
func (c *creation) sshKeys(context.Context) (err error) {
	c.in.State = c.st
	if c.in.Placeholders, err = c.m.placeholders(c.st.Name); err != nil {
		return err
	}
	if c.in.AuthorizedKey, err = cloudinit.GenerateSSHKey(c.f.SSHKey, "abox-"+c.st.Name, nil); err != nil {
		return err
	}
	if c.in.HostKeyPEM, c.in.HostPublicKey, err = newHostKey(); err != nil {
		return err
	}
	known := fmt.Sprintf("%s %s\n", c.st.GuestIP, c.in.HostPublicKey)
	return fsutil.WriteFileAtomic(c.f.KnownHosts, []byte(known), PrivateFile)
}

// writeLists writes the allowlist (seeded from --allowlist) and the
// upstream CA bundle.
func (c *creation) writeLists(context.Context) error {
	allow := "# abox allowlist of " + c.st.Name + ": one name per line; *.example.com allows every name below example.com\n"
	if len(c.seedEntries) > 0 {
		allow += strings.Join(c.seedEntries, "\n") + "\n"
	}
	if err := fsutil.WriteFileAtomic(c.f.Allowlist, []byte(allow), PrivateFile); err != nil {
		return err
	}
	if c.upstreamCA != nil {
		c.st.UpstreamCA = filepath.Join(c.f.Dir, "upstream-ca.pem")
		if err := fsutil.WriteFileAtomic(c.st.UpstreamCA, c.upstreamCA, PrivateFile); err != nil {
			return err
		}
	}
	return nil
}

func (c *creation) diskOverlay(ctx context.Context) error {
	st := c.st
	c.m.progress("creating %s: disk overlay on base %s (%d GiB)", st.Name, st.Base, st.DiskGiB)
	if _, err := c.m.Run.Run(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", c.base.Disk(), c.f.Disk, strconv.FormatUint(uint64(st.DiskGiB), 10)+"G"); err != nil {
		return fmt.Errorf("disk overlay: %w", err)
	}
	// qemu-img creates it by the umask (world-readable): the guest's disk
	// is the guest's data.
	if err := os.Chmod(c.f.Disk, PrivateFile); err != nil {
		return fmt.Errorf("disk overlay: %w", err)
	}
	return nil
}

// monitorBundle checks the bundle src (a file, or BundleRelease) into the
// host's agent cache. Nothing of the instance exists yet: a refused bundle
// leaves nothing behind, and none of it in the cache.
func (m *Manager) monitorBundle(ctx context.Context, src, label string) (*MonitorBundle, error) {
	cache := tetragon.Cache{Dir: m.Layout.AgentCache()}
	var (
		path, source string
		info         tetragon.Info
		err          error
	)
	if src == BundleRelease {
		source = "release " + tetragon.Pinned.Version
		m.progress("monitor: tetragon %s (pinned sha256 %s), from the agent cache or %s", tetragon.Pinned.Version, tetragon.Pinned.SHA256, tetragon.Pinned.URL)
		path, info, err = cache.Fetch(ctx, nil, tetragon.Pinned)
	} else {
		if source, err = filepath.Abs(src); err != nil {
			return nil, err
		}
		if label != "" {
			path, info, err = cache.Import(source, label)
			source = label
		} else {
			path, info, err = cache.Import(source, "")
		}
	}
	if err != nil {
		return nil, err
	}
	m.progress("monitor: bundle %s checked: sha256 %s, %d BPF objects, %d MiB unpacked", source, info.SHA256, info.BPFObjects, info.Unpacked>>20)
	return &MonitorBundle{SHA256: info.SHA256, Source: source, Path: path, Prefix: info.Prefix, Size: info.Size, BPFObjects: info.BPFObjects}, nil
}

// defineSteps define the network, filter and domain of *st in libvirt,
// each undone by its undefinition; the domain's warnings go to *warnings.
// They read *st when they run, so earlier steps may still fill it in.
func (m *Manager) defineSteps(st *State, warnings *[]string) []steps.Step {
	return []steps.Step{
		{Name: "define the network", Do: func(ctx context.Context) error {
			x, err := libvirt.NetworkXML(ParamsOf(m.Layout, *st))
			if err != nil {
				return err
			}
			return m.Hypervisor.DefineNetwork(ctx, x)
		}, Undo: func(ctx context.Context) error {
			return m.Hypervisor.UndefineNetwork(ctx, libvirt.NetworkName(st.Name))
		}},
		// The filter must exist before the domain that references it, so no
		// definition of the domain is ever without its packet filter.
		{Name: "define the packet filter", Do: func(ctx context.Context) error {
			x, err := libvirt.NWFilterXML(ParamsOf(m.Layout, *st))
			if err != nil {
				return err
			}
			return m.Hypervisor.DefineNWFilter(ctx, x)
		}, Undo: func(ctx context.Context) error {
			return m.Hypervisor.UndefineNWFilter(ctx, libvirt.FilterName(st.Name))
		}},
		{Name: "define the domain", Do: func(ctx context.Context) error {
			x, warn, err := m.domainXML(*st)
			if err != nil {
				return err
			}
			if warn != "" {
				*warnings = append(*warnings, warn)
			}
			return m.Hypervisor.DefineDomain(ctx, x)
		}, Undo: func(ctx context.Context) error { return m.Hypervisor.UndefineDomain(ctx, libvirt.DomainName(st.Name)) }},
	}
}

// domainXML is st's domain: the user template's, checked, or the hardened one.
func (m *Manager) domainXML(st State) (xml, warning string, err error) {
	p := ParamsOf(m.Layout, st)
	if st.Template != "" {
		return libvirt.RenderTemplate(st.Template, p)
	}
	xml, err = libvirt.DomainXML(p)
	return xml, "", err
}

// BackingPath is the one backing file an instance's overlay may name: the
// disk of the base it was created on (an imported disk stands alone and
// names none; the base's path is still the only one allowed).
func BackingPath(l paths.Layout, st State) string {
	return filepath.Join(l.Images(), st.Base, image.DiskFile)
}

// ParamsOf maps state to the libvirt builders' parameters.
func ParamsOf(l paths.Layout, st State) libvirt.Params {
	f := l.Instance(st.Name)
	monitor := ""
	if st.Monitor {
		monitor = f.MonitorSocket
	}
	return libvirt.Params{
		MonitorSocket: monitor,
		Name:          st.Name, UUID: st.UUID,
		Bridge: st.Bridge, Subnet: st.Subnet, Gateway: st.Gateway, GuestIP: st.GuestIP, MAC: st.MAC,
		ProxyPort: st.ProxyPort, CPUs: st.CPUs, MemoryMiB: st.MemoryMiB,
		CaptureHTTPPort: CaptureHTTPPort, CaptureTLSPort: CaptureTLSPort,
		DiskPath:      f.Disk,
		SeedISOPath:   f.Seed,
		SerialLogPath: f.SerialLog,
		BackingPath:   BackingPath(l, st),
		InstanceDir:   f.Dir,
		Kernel:        st.Kernel, Initrd: st.Initrd, Cmdline: st.Cmdline,
		Accel: libvirt.Accel(st.Accel),
	}
}

func withDefaults(s Spec) (Spec, error) {
	if s.Base == "" {
		s.Base = "debian-12"
	}
	if s.CPUs == 0 {
		s.CPUs = DefaultCPUs
	}
	if s.MemoryMiB == 0 {
		s.MemoryMiB = DefaultMemoryMiB
	}
	if s.DiskGiB == 0 {
		s.DiskGiB = DefaultDiskGiB
	}
	if s.User == "" {
		s.User = DefaultUser
	}
	if !validUser(s.User) {
		return s, fmt.Errorf("user %q: want a lowercase Unix user name such as %s", s.User, DefaultUser)
	}
	switch s.Accel {
	case "", "auto", "kvm", "tcg":
	default:
		return s, fmt.Errorf("accel %q: want kvm, tcg or auto", s.Accel)
	}
	if s.CPUs > 64 {
		return s, fmt.Errorf("cpus %d: want 1 to 64", s.CPUs)
	}
	if s.MemoryMiB < 256 {
		return s, fmt.Errorf("memory %d MiB: want at least 256", s.MemoryMiB)
	}
	if s.DiskGiB > 4096 {
		return s, fmt.Errorf("disk %d GiB: want at most 4096", s.DiskGiB)
	}
	if s.Subnet.IsValid() && (s.Subnet.Bits() != 24 || !s.Subnet.Addr().Is4() || s.Subnet != s.Subnet.Masked()) {
		return s, fmt.Errorf("subnet %s: want an IPv4 /24 such as 10.10.7.0/24", s.Subnet)
	}
	for _, h := range s.MITMExceptions {
		if _, err := allowlist.NormalizeName(h); err != nil {
			return s, fmt.Errorf("mitm exception %q: %w", h, err)
		}
	}
	return s, nil
}

func validUser(u string) bool {
	if u == "" || len(u) > 32 || u == "root" {
		return false
	}
	for i, c := range u {
		if !(c >= 'a' && c <= 'z' || c == '_' || i > 0 && (c >= '0' && c <= '9' || c == '-')) {
			return false
		}
	}
	return true
}

func resolveAccel(a string) string {
	switch a {
	case "kvm", "tcg":
		return a
	}
	if hostHasWorkingKVM() {
		return "kvm"
	}
	return "tcg"
}

func readAllowlist(path string) ([]string, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading allowlist: %w", err)
	}
	defer fh.Close()
	l, err := allowlist.Parse(fh, path)
	if err != nil {
		return nil, err
	}
	// Lines, not entries: a name's rules are part of what it allows.
	var out []string
	for _, ln := range l.Lines() {
		out = append(out, ln.String())
	}
	return out, nil
}

// checkSubnet refuses a requested instance subnet that is not a private
// IPv4 /24 given by its network address: a public range would put the
// guests on addresses of the internet (and answers from it on the host's
// bridge), another size breaks the layout of gateway and guest addresses.
func checkSubnet(p netip.Prefix) error {
	if !p.Addr().Is4() || p.Bits() != 24 || p.Masked() != p || !p.Addr().IsPrivate() {
		return fmt.Errorf("subnet %s: want a private IPv4 /24 by its network address (in 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16), such as 10.10.7.0/24; leave --subnet out to pick a free one", p)
	}
	return nil
}

func (m *Manager) allocateSubnet(ctx context.Context, want netip.Prefix) (netip.Prefix, error) {
	if want.IsValid() {
		if err := checkSubnet(want); err != nil {
			return netip.Prefix{}, err
		}
	}
	var used []netip.Prefix
	others, err := ListStates(m.Layout)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, o := range others {
		used = append(used, o.Subnet)
	}
	nets, err := m.Hypervisor.ListNetworks(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, n := range nets {
		used = append(used, n.Subnets...)
	}
	routes, err := libvirt.HostRoutes(ctx, m.Run)
	if err != nil {
		return netip.Prefix{}, err
	}
	used = append(used, routes...)
	if want.IsValid() {
		for _, u := range used {
			if u.IsValid() && u.Overlaps(want) {
				return netip.Prefix{}, &SubnetInUseError{Subnet: want, Overlaps: u}
			}
		}
		return want, nil
	}
	pool := m.Pool
	if pool == "" {
		pool = DefaultPool
	}
	pp, err := netip.ParsePrefix(pool)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("address pool %q: %w", pool, err)
	}
	return libvirt.AllocateSubnet(pp, used)
}

func (m *Manager) allocateBridge(name string) (string, error) {
	br, err := validate.BridgeName(name)
	if err != nil {
		return "", err
	}
	others, err := ListStates(m.Layout)
	if err != nil {
		return "", err
	}
	for _, o := range others {
		if o.Bridge == br {
			return "", &BridgeTakenError{Name: name, Bridge: br, By: o.Name}
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", br)); err == nil {
		return "", &BridgeTakenError{Name: name, Bridge: br}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	return br, nil
}

// allocateMAC draws a random locally administered MAC that no other
// instance has (the caller holds the global lock).
func (m *Manager) allocateMAC() (string, error) {
	others, err := ListStates(m.Layout)
	if err != nil {
		return "", err
	}
	used := map[string]bool{}
	for _, o := range others {
		used[strings.ToLower(o.MAC)] = true
	}
	for range 100 {
		mac, err := validate.NewMAC(rand.Reader)
		if err != nil {
			return "", err
		}
		if !used[strings.ToLower(mac)] {
			return mac, nil
		}
	}
	return "", errors.New("allocating a MAC address: no free address found")
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func newHostKey() (privPEM []byte, pubLine string, err error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		return nil, "", err
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, "", err
	}
	return pem.EncodeToMemory(blk), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))), nil
}
