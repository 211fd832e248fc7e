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
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
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

// Create defines a new instance. On any failure everything it made is undone.
func (m *Manager) Create(ctx context.Context, spec Spec) (st State, warnings []string, err error) {
	if err := validate.InstanceName(spec.Name); err != nil {
		return State{}, nil, err
	}
	spec, err = withDefaults(spec)
	if err != nil {
		return State{}, nil, err
	}
	base, err := m.Images.Get(spec.Base)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return State{}, nil, fmt.Errorf("creating %s: base image %q is not installed (build one with `abox base build debian-12`, or `abox base import %s FILE`)", spec.Name, spec.Base, spec.Base)
		}
		return State{}, nil, fmt.Errorf("creating %s: %w", spec.Name, err)
	}
	var seedEntries []string
	if spec.Allowlist != "" {
		seedEntries, err = readAllowlist(spec.Allowlist)
		if err != nil {
			return State{}, nil, err
		}
	}
	var upstreamCA []byte
	if spec.UpstreamCA != "" {
		if upstreamCA, err = os.ReadFile(spec.UpstreamCA); err != nil {
			return State{}, nil, fmt.Errorf("reading upstream CA bundle: %w", err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(upstreamCA) {
			return State{}, nil, fmt.Errorf("upstream CA bundle %s holds no PEM certificate", spec.UpstreamCA)
		}
	}
	if spec.UpstreamProxy != "" {
		if _, err := egress.NewParentProxy(spec.UpstreamProxy, spec.UpstreamProxyCredentials); err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", spec.Name, err)
		}
		if spec.UpstreamProxyCredentials != "" {
			if spec.UpstreamProxyCredentials, err = filepath.Abs(spec.UpstreamProxyCredentials); err != nil {
				return State{}, nil, err
			}
		}
	} else if spec.UpstreamProxyCredentials != "" {
		return State{}, nil, fmt.Errorf("creating %s: upstream proxy credentials without an upstream proxy", spec.Name)
	}
	var bundle *MonitorBundle
	if spec.MonitorBundle != "" {
		spec.Monitor = true
		if bundle, err = m.monitorBundle(ctx, spec.MonitorBundle, spec.MonitorBundleSource); err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", spec.Name, err)
		}
	}
	var template string
	if spec.Template != "" {
		b, err := os.ReadFile(spec.Template)
		if err != nil {
			return State{}, nil, fmt.Errorf("reading domain template: %w", err)
		}
		template = string(b)
	}

	unlock, err := globalLock(m.Layout)
	if err != nil {
		return State{}, nil, err
	}
	defer unlock()

	f := m.Layout.Instance(spec.Name)
	if _, err := os.Stat(f.Dir); err == nil {
		if _, serr := os.Stat(f.State); serr == nil {
			return State{}, nil, fmt.Errorf("creating %s: an instance of that name exists (remove it with `abox remove %s`, or pick another name)", spec.Name, spec.Name)
		}
		// A directory without state is an interrupted create; it holds
		// nothing of value (instances are only real once state is written).
		if err := os.RemoveAll(f.Dir); err != nil {
			return State{}, nil, fmt.Errorf("creating %s: clearing an interrupted create: %w", spec.Name, err)
		}
	}
	if _, err := m.Hypervisor.State(ctx, libvirt.DomainName(spec.Name)); !errors.Is(err, libvirt.ErrNotFound) {
		if err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", spec.Name, err)
		}
		return State{}, nil, fmt.Errorf("creating %s: libvirt already has a domain %s not known to abox; remove it with virsh or pick another name", spec.Name, libvirt.DomainName(spec.Name))
	}

	st = State{
		Name: spec.Name, UUID: newUUID(), CreatedAt: time.Now().UTC(),
		Base: spec.Base, CPUs: spec.CPUs, MemoryMiB: spec.MemoryMiB, DiskGiB: spec.DiskGiB,
		User: spec.User, Accel: resolveAccel(spec.Accel),
		ProxyPort: DefaultProxyPort, Upstreams: spec.Upstreams, AllowPrivate: spec.AllowPrivate, AllowHost: spec.AllowHost,
		NoMITM: spec.NoMITM, MITMExceptions: spec.MITMExceptions, Ports: spec.Ports, Monitor: spec.Monitor,
		MonitorBundle: bundle,
		Template:      template,
		UpstreamProxy: spec.UpstreamProxy, UpstreamProxyCredentials: spec.UpstreamProxyCredentials,
		Kernel: base.KernelPath(), Initrd: base.InitrdPath(),
	}
	if base.Boot != nil {
		st.Cmdline = base.Boot.Cmdline
	}
	if st.Subnet, err = m.allocateSubnet(ctx, spec.Subnet); err != nil {
		return State{}, nil, err
	}
	st.Gateway, st.GuestIP = libvirt.InstanceAddresses(st.Subnet)
	if st.Bridge, err = m.allocateBridge(spec.Name); err != nil {
		return State{}, nil, err
	}
	if st.MAC, err = m.allocateMAC(); err != nil {
		return State{}, nil, err
	}

	var undo undoStack
	defer func() {
		if err != nil {
			if uerr := undo.run(context.WithoutCancel(ctx)); uerr != nil {
				err = fmt.Errorf("%w (and rolling back: %v)", err, uerr)
			}
		}
	}()

	m.progress("creating %s: subnet %s, bridge %s, accel %s", st.Name, st.Subnet, st.Bridge, st.Accel)
	// QEMU runs as an unprivileged user: it must traverse the data root,
	// the instance directory and logs/ to its disk, seed and serial log,
	// and nothing more (see perms.go).
	for _, d := range []string{m.Layout.Root, m.Layout.Instances()} {
		// Directories we may not own: only add the search bits.
		if err = os.MkdirAll(d, 0o711); err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", st.Name, err)
		}
		var fi os.FileInfo
		if fi, err = os.Stat(d); err == nil && fi.Mode().Perm()&0o011 != 0o011 {
			err = os.Chmod(d, fi.Mode().Perm()|0o011)
		}
		if err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", st.Name, err)
		}
	}
	if _, err = os.Stat(f.Dir); err == nil {
		return State{}, nil, fmt.Errorf("creating %s: %s appeared meanwhile", st.Name, f.Dir)
	}
	undo.push("remove instance directory", func(context.Context) error { return os.RemoveAll(f.Dir) })
	for _, d := range []struct {
		path string
		qemu bool
	}{{f.Dir, true}, {f.LogsDir, true}, {filepath.Dir(f.SSHKey), false}, {f.RunDir, false}} {
		if d.qemu {
			err = makeQEMUDir(d.path)
		} else {
			err = makePrivateDir(d.path)
		}
		if err != nil {
			return State{}, nil, fmt.Errorf("creating %s: %w", st.Name, err)
		}
	}

	var in SeedInput
	in.State = st
	if in.Placeholders, err = m.placeholders(st.Name); err != nil {
		return State{}, nil, err
	}
	if in.AuthorizedKey, err = cloudinit.GenerateSSHKey(f.SSHKey, "abox-"+st.Name, nil); err != nil {
		return State{}, nil, err
	}
	if in.HostKeyPEM, in.HostPublicKey, err = newHostKey(); err != nil {
		return State{}, nil, err
	}
	known := fmt.Sprintf("%s %s\n", st.GuestIP, in.HostPublicKey)
	if err = fsutil.WriteFileAtomic(f.KnownHosts, []byte(known), PrivateFile); err != nil {
		return State{}, nil, err
	}
	authority, err := ca.New(ca.Config{Dir: f.CADir})
	if err != nil {
		return State{}, nil, fmt.Errorf("creating %s: instance CA: %w", st.Name, err)
	}
	if in.CACertPEM, err = authority.CertPEM(); err != nil {
		return State{}, nil, fmt.Errorf("creating %s: instance CA: %w", st.Name, err)
	}
	allow := "# abox allowlist of " + st.Name + ": one name per line; *.example.com allows every name below example.com\n"
	if len(seedEntries) > 0 {
		allow += strings.Join(seedEntries, "\n") + "\n"
	}
	if err = fsutil.WriteFileAtomic(f.Allowlist, []byte(allow), PrivateFile); err != nil {
		return State{}, nil, err
	}
	if upstreamCA != nil {
		st.UpstreamCA = filepath.Join(f.Dir, "upstream-ca.pem")
		if err = fsutil.WriteFileAtomic(st.UpstreamCA, upstreamCA, PrivateFile); err != nil {
			return State{}, nil, err
		}
	}
	m.progress("creating %s: disk overlay on base %s (%d GiB)", st.Name, st.Base, st.DiskGiB)
	if _, err = m.Run.Run(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base.Disk(), f.Disk, strconv.FormatUint(uint64(st.DiskGiB), 10)+"G"); err != nil {
		return State{}, nil, fmt.Errorf("creating %s: disk overlay: %w", st.Name, err)
	}
	// qemu-img creates it by the umask (world-readable): the guest's disk
	// is the guest's data.
	if err = os.Chmod(f.Disk, PrivateFile); err != nil {
		return State{}, nil, fmt.Errorf("creating %s: disk overlay: %w", st.Name, err)
	}
	if err = m.Seeds.WriteSeed(ctx, f.Seed, in); err != nil {
		return State{}, nil, fmt.Errorf("creating %s: cloud-init seed: %w", st.Name, err)
	}
	// The public halves too: one rule (0600) for every file is one a
	// test can check, and nothing but abox reads them.
	for _, p := range []string{f.Seed, f.SSHKey + ".pub", filepath.Join(f.CADir, ca.CertFile)} {
		if err = os.Chmod(p, PrivateFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return State{}, nil, fmt.Errorf("creating %s: %w", st.Name, err)
		}
	}
	if warnings, err = m.define(ctx, st, &undo); err != nil {
		return State{}, nil, err
	}
	if err = Save(m.Layout, st); err != nil {
		return State{}, nil, err
	}
	return st, warnings, nil
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

// define (re)defines the network, filter and domain of st in libvirt.
func (m *Manager) define(ctx context.Context, st State, undo *undoStack) (warnings []string, err error) {
	p := ParamsOf(m.Layout, st)
	netXML, err := libvirt.NetworkXML(p)
	if err != nil {
		return nil, err
	}
	filterXML, err := libvirt.NWFilterXML(p)
	if err != nil {
		return nil, err
	}
	domXML, warn, err := m.domainXML(st)
	if err != nil {
		return nil, err
	}
	if warn != "" {
		warnings = append(warnings, warn)
	}
	net, filter, dom := libvirt.NetworkName(st.Name), libvirt.FilterName(st.Name), libvirt.DomainName(st.Name)
	if err := m.Hypervisor.DefineNetwork(ctx, netXML); err != nil {
		return nil, err
	}
	undo.push("undefine network", func(ctx context.Context) error { return m.Hypervisor.UndefineNetwork(ctx, net) })
	// The filter must exist before the domain that references it, so no
	// definition of the domain is ever without its packet filter.
	if err := m.Hypervisor.DefineNWFilter(ctx, filterXML); err != nil {
		return nil, err
	}
	undo.push("undefine nwfilter", func(ctx context.Context) error { return m.Hypervisor.UndefineNWFilter(ctx, filter) })
	if err := m.Hypervisor.DefineDomain(ctx, domXML); err != nil {
		return nil, err
	}
	undo.push("undefine domain", func(ctx context.Context) error { return m.Hypervisor.UndefineDomain(ctx, dom) })
	return warnings, nil
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
				return netip.Prefix{}, fmt.Errorf("subnet %s is in use (overlaps %s); leave --subnet out to pick a free one", want, u)
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
			return "", fmt.Errorf("bridge %s of %s is already used by instance %s; rename one of them", br, name, o.Name)
		}
	}
	if _, err := os.Stat(filepath.Join("/sys/class/net", br)); err == nil {
		return "", fmt.Errorf("a host interface %s already exists; remove it (ip link del %s) or pick another instance name", br, br)
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

// undoStack runs rollback steps in reverse order and reports every failure.
type undoStack struct {
	steps []undoStep
}

type undoStep struct {
	what string
	fn   func(context.Context) error
}

func (u *undoStack) push(what string, fn func(context.Context) error) {
	u.steps = append(u.steps, undoStep{what, fn})
}

func (u *undoStack) run(ctx context.Context) error {
	var errs []error
	for i := len(u.steps) - 1; i >= 0; i-- {
		if err := u.steps[i].fn(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", u.steps[i].what, err))
		}
	}
	u.steps = nil
	return errors.Join(errs...)
}
