package instance

// The checks abox import applies to what an archive carries: its state,
// its trust, its disk and its SSH key (import.go has the flow).

import (
	"context"
	"crypto/ed25519"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

// importedState is src as the new instance name: the fresh fields zero
// (allocated later) or new, the paths it names rewritten to the new
// instance's own files, every value checked as create checks its flags.
// has is the set of entries the archive carries; creds is this host's
// credentials file for the archive's upstream proxy (--upstream-proxy-
// credentials), never a path the archive names.
func importedState(m *Manager, src State, name string, has map[string]bool, creds string) (State, error) {
	st := src
	st.Name, st.UUID, st.CreatedAt = name, newUUID(), time.Now().UTC()
	st.Subnet, st.Gateway, st.GuestIP, st.Bridge, st.MAC = netip.Prefix{}, netip.Addr{}, netip.Addr{}, "", ""
	f := m.Layout.Instance(name)
	var errs []error
	need := func(entry string, set bool, what string) {
		if set && !has[entry] {
			errs = append(errs, fmt.Errorf("the state names %s but the archive lacks %s", what, entry))
		}
		if !set && has[entry] {
			errs = append(errs, fmt.Errorf("the archive carries %s but the state names no %s", entry, what))
		}
	}
	need(archive.UpstreamCA, st.UpstreamCA != "", "an upstream CA")
	need(archive.Kernel, st.Kernel != "", "a kernel")
	need(archive.Initrd, st.Initrd != "", "an initrd")
	need(archive.MonitorBundle, st.MonitorBundle != nil, "a monitor bundle")
	for _, e := range []string{archive.Allowlist, archive.CACert, archive.CAKey, archive.SSHKey} {
		if !has[e] {
			errs = append(errs, fmt.Errorf("the archive lacks %s", e))
		}
	}
	if st.UpstreamCA != "" {
		st.UpstreamCA = filepath.Join(f.Dir, "upstream-ca.pem")
	}
	if st.Kernel != "" {
		st.Kernel = f.Kernel
	}
	if st.Initrd != "" {
		st.Initrd = f.Initrd
	}
	if st.MonitorBundle != nil {
		b := *st.MonitorBundle
		st.MonitorBundle = &b
		if !st.Monitor {
			errs = append(errs, errors.New("a monitor bundle without the monitor"))
		}
	}
	// What create's flags would have refused.
	if _, err := withDefaults(Spec{Name: name, Base: st.Base, CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, DiskGiB: st.DiskGiB, User: st.User, Accel: st.Accel, MITMExceptions: st.MITMExceptions}); err != nil {
		errs = append(errs, err)
	}
	if err := validate.InstanceName(st.Base); err != nil {
		errs = append(errs, fmt.Errorf("base %q: %w", st.Base, err))
	}
	if st.CPUs == 0 || st.DiskGiB == 0 || st.User == "" {
		errs = append(errs, errors.New("cpus, disk and user must be set"))
	}
	if st.Accel != "kvm" && st.Accel != "tcg" {
		errs = append(errs, fmt.Errorf("accel %q: want kvm or tcg", st.Accel))
	}
	if st.ProxyPort != DefaultProxyPort {
		errs = append(errs, fmt.Errorf("proxy port %d: abox uses %d", st.ProxyPort, DefaultProxyPort))
	}
	// What the filter daemon accepts (upstream.ParseServer, which this
	// package leaves to the daemon): IP or IP:PORT, port not 0.
	for _, u := range st.Upstreams {
		ap, err := netip.ParseAddrPort(u)
		if err != nil {
			_, err = netip.ParseAddr(strings.Trim(u, "[]"))
		} else if ap.Port() == 0 {
			err = errors.New("port 0")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream %q: want IP or IP:PORT", u))
		}
	}
	// The ranges create's flags take (netclass.ParsePermit, as --allow-
	// private and --allow-host): a /0 is refused; a wide range's warning
	// comes with the trust list (ImportWidenings).
	for _, pp := range []struct {
		key string
		ps  *[]netip.Prefix
	}{{"allow_private", &st.AllowPrivate}, {"allow_host", &st.AllowHost}} {
		ps, _, err := checkPermits(pp.key, *pp.ps)
		if err != nil {
			errs = append(errs, err)
		}
		*pp.ps = ps
	}
	// The credentials file is a path on the exporting host: it is never
	// read here (it could name any file of this host, whose first line
	// would then go to the archive's proxy). The archive only tells that
	// its proxy took credentials; this host's file is the user's choice.
	carried := src.UpstreamProxyCredentials
	st.UpstreamProxyCredentials = ""
	if st.UpstreamProxy != "" {
		if carried != "" && creds == "" {
			errs = append(errs, fmt.Errorf("the upstream proxy took its credentials from %s on the exporting host, which an import never reads: name this host's file with --upstream-proxy-credentials FILE", termtext.Clean(carried)))
		}
		if creds != "" {
			abs, err := filepath.Abs(creds)
			if err != nil {
				errs = append(errs, err)
			}
			st.UpstreamProxyCredentials = abs
		}
		if _, err := egress.NewParentProxy(st.UpstreamProxy, st.UpstreamProxyCredentials); err != nil {
			errs = append(errs, err)
		}
	} else if carried != "" {
		errs = append(errs, errors.New("upstream proxy credentials without an upstream proxy"))
	} else if creds != "" {
		errs = append(errs, errors.New("--upstream-proxy-credentials: the archive's instance has no upstream proxy"))
	}
	// Strings abox shows later (status, messages) must not steer a
	// terminal; the rest are checked above or are the template's XML.
	texts := []struct{ what, s string }{{"kernel command line", st.Cmdline}, {"upstream proxy credentials", carried}}
	if b := st.MonitorBundle; b != nil {
		texts = append(texts, struct{ what, s string }{"monitor bundle source", b.Source})
		if len(b.SHA256) != 64 || strings.Trim(b.SHA256, "0123456789abcdef") != "" {
			errs = append(errs, fmt.Errorf("monitor bundle sha256 %q: want 64 lowercase hex digits", b.SHA256))
		}
	}
	for _, x := range texts {
		if err := termtext.Check(x.s); err != nil || len(x.s) > 4096 {
			errs = append(errs, fmt.Errorf("%s %q: want at most 4096 printable characters", x.what, termtext.Clean(x.s)))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return State{}, fmt.Errorf("the archive's instance settings are refused: %w", err)
	}
	return st, nil
}

// ImportWidenings lists what in st (an archive's settings) and its
// allowlist widens the sandbox beyond a fresh create: abox.yaml's trust
// rule (config.Config.Widenings), plus --allow-host, which abox.yaml has
// no key for.
func ImportWidenings(st State, allow []allowlist.Line) []config.Widening {
	c := config.Config{
		CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, DiskGiB: st.DiskGiB, Allowlist: allow,
		Ports: st.Ports, AllowPrivate: st.AllowPrivate, NoMITM: st.NoMITM, MITMExceptions: st.MITMExceptions,
		Upstreams: st.Upstreams, ProxyCredentials: st.UpstreamProxyCredentials,
		Monitor: st.Monitor,
	}
	if st.MonitorBundle != nil {
		c.MonitorBundle = "the archive's " + archive.MonitorBundle
	}
	if st.Template != "" {
		c.Template = "the archive's domain template"
	}
	if st.UpstreamCA != "" {
		c.UpstreamCA = "the archive's " + archive.UpstreamCA
	}
	if st.UpstreamProxy != "" {
		if u, err := url.Parse(st.UpstreamProxy); err == nil {
			c.UpstreamProxy = u
		}
	}
	_, c.Warnings, _ = checkPermits("allow_private", st.AllowPrivate)
	out := c.Widenings()
	if len(st.AllowHost) > 0 {
		var s []string
		for _, p := range st.AllowHost {
			s = append(s, p.String())
		}
		why := "lets the guest reach host addresses " + strings.Join(s, ", ")
		_, warnings, _ := checkPermits("allow_host", st.AllowHost)
		for _, w := range warnings {
			why += " (warning: " + w + ")"
		}
		out = append(out, config.Widening{Key: "allow_host", Why: why})
	}
	return out
}

// checkPermits parses an archive's ranges as create parses its flags'
// (netclass.ParsePermit): it returns them normalized, with the warnings of
// those wider than a site, or an error naming each that create refuses.
func checkPermits(key string, ps []netip.Prefix) ([]netip.Prefix, []string, error) {
	var out []netip.Prefix
	var warnings []string
	var errs []error
	for _, p := range ps {
		q, w, err := netclass.ParsePermit(key, p.String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, q)
		if w != "" {
			warnings = append(warnings, w)
		}
	}
	return out, warnings, errors.Join(errs...)
}

// checkTrust refuses st unless it widens nothing or the user trusts it.
func (m *Manager) checkTrust(file string, st State, allowFile string, trust bool) error {
	fh, err := os.Open(allowFile)
	if err != nil {
		return fmt.Errorf("importing %s: the allowlist: %w", file, err)
	}
	defer fh.Close()
	list, err := allowlist.Parse(fh, archive.Allowlist)
	if err != nil {
		return fmt.Errorf("importing %s: %w", file, err)
	}
	w := ImportWidenings(st, list.Lines())
	if len(w) == 0 {
		return nil
	}
	if !trust {
		return &WideningError{File: file, Widenings: w}
	}
	for _, x := range w {
		m.progress("importing %s: trusted: %s: %s", st.Name, x.Key, x.Why)
	}
	return nil
}

// checkDisk refuses a disk that is not a plain standalone image of the
// format its entry names: qemu-img probes it (a "raw" file that probes as
// qcow2 is the format-confusion attack), and a backing file or external
// data file would make QEMU open a host path of the archive's choosing.
func (m *Manager) checkDisk(ctx context.Context, path, entry string, diskGiB uint) error {
	want := "qcow2"
	if entry == archive.DiskRaw {
		want = "raw"
	}
	info, err := m.diskInfo(ctx, path, want)
	if err != nil {
		return fmt.Errorf("the disk %s is not a plain %s image: %w", entry, want, err)
	}
	if want == "raw" {
		fh, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("the disk: %w", err)
		}
		var magic [4]byte
		_, err = io.ReadFull(fh, magic[:])
		fh.Close()
		if err == nil && string(magic[:]) == "QFI\xfb" {
			return fmt.Errorf("the disk %s is a %q image, want plain raw", entry, "qcow2")
		}
	}
	switch {
	case info.Format != want:
		return fmt.Errorf("the disk %s is a %q image, want plain %s", entry, info.Format, want)
	case info.BackingFilename != "" || info.FullBacking != "":
		return fmt.Errorf("the disk %s has a backing file %q: an archive's disk must stand alone (abox export flattens it)", entry, info.BackingFilename)
	case info.Specific.Data.DataFile != "":
		return fmt.Errorf("the disk %s has an external data file %q: an archive's disk must stand alone", entry, info.Specific.Data.DataFile)
	case len(info.Snapshots) > 0:
		// export never carries snapshots (qemu-img convert copies the
		// current state only); libvirt would know nothing of these.
		return fmt.Errorf("the disk %s holds %d internal snapshot(s): an archive's disk holds the current state only", entry, len(info.Snapshots))
	case info.Encrypted:
		return fmt.Errorf("the disk %s is encrypted", entry)
	case info.VirtualSize <= 0 || info.VirtualSize > int64(diskGiB)<<30:
		return fmt.Errorf("the disk %s is %d bytes, not within the state's %d GiB", entry, info.VirtualSize, diskGiB)
	}
	return nil
}

// diskInfo is what qemu-img reads of a disk's own header, the disk opened
// as format and never probed: a file that probes as vmdk (a text
// descriptor) makes qemu-img open the extent paths it names, any host
// file, device or FIFO. With -f qemu-img info opens neither a backing nor
// a data file (checked in the tests with FIFOs there); the bound is for
// anything else. A raw disk is read by its bytes, so "raw" always answers.
func (m *Manager) diskInfo(ctx context.Context, path, format string) (diskHeader, error) {
	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var info diskHeader
	out, err := m.Run.Run(ictx, "qemu-img", "info", "-f", format, "--output=json", path)
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return info, fmt.Errorf("reading qemu-img info: %w", err)
	}
	return info, nil
}

// diskHeader is the part of `qemu-img info --output=json` abox judges.
type diskHeader struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	FullBacking     string `json:"full-backing-filename"`
	BackingFormat   string `json:"backing-filename-format"`
	Encrypted       bool   `json:"encrypted"`
	Snapshots       []struct {
		Name string `json:"name"`
	} `json:"snapshots"`
	Specific struct {
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// checkDiskEntry refuses a disk entry, before a byte of it is written,
// whose declared size the state's disk cannot hold (a gzip stream or a
// sparse tar entry of a few KiB can declare terabytes of zeros) or that
// would not fit in dir's free space, less fsutil.Reserve (for a raw disk
// twice: qemu-img converts it into a qcow2 beside it).
func checkDiskEntry(dir string, ent archive.File, diskGiB uint) error {
	virtual := int64(diskGiB) << 30
	// A qcow2 of 64 KiB clusters (what export writes) holds its virtual
	// size in data plus about 1/6000 of it in L2 and refcount tables.
	limit, need := virtual+virtual/64+16<<20, ent.Size
	if ent.Name == archive.DiskRaw {
		limit, need = virtual, ent.Size+virtual+virtual/64+16<<20
	}
	if ent.Size > limit {
		return fmt.Errorf("the archive's %s is %d bytes, more than the state's %d GiB disk can hold", ent.Name, ent.Size, diskGiB)
	}
	free, err := fsutil.FreeBytes(dir)
	if err != nil {
		return fmt.Errorf("the free space for the disk: %w", err)
	}
	if reserve := fsutil.Reserve(dir); need > free-reserve {
		return fmt.Errorf("the disk %s needs %d MiB and the file system of %s has %d MiB free, of which %d MiB stay free: free some space first", ent.Name, need>>20, dir, free>>20, reserve>>20)
	}
	return nil
}

// importSSHKey checks the carried private key (an unencrypted ed25519
// OpenSSH key) and writes its public half next to it; it returns the
// authorized_keys line.
func importSSHKey(path, comment string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	k, err := ssh.ParseRawPrivateKey(b)
	if err != nil {
		return "", fmt.Errorf("the ssh key: %w", err)
	}
	priv, ok := k.(*ed25519.PrivateKey)
	if !ok {
		return "", fmt.Errorf("the ssh key is a %T, want ed25519", k)
	}
	pub, err := ssh.NewPublicKey(priv.Public())
	if err != nil {
		return "", fmt.Errorf("the ssh key: %w", err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub))) + " " + comment
	return line, writeNewFile(path+".pub", strings.NewReader(line+"\n"))
}

// UsesBase reports whether st depends on its base image: its disk is an
// overlay on it (the qcow2 header names a backing file) or it boots the
// base's kernel. An imported instance (a flattened disk, its own kernel)
// does not, though its state still names the base it came from.
func UsesBase(l paths.Layout, st State) (bool, error) {
	f := l.Instance(st.Name)
	if st.Kernel != "" && st.Kernel != f.Kernel {
		return true, nil
	}
	fh, err := os.Open(f.Disk)
	if err != nil {
		return false, err
	}
	defer fh.Close()
	// qcow2: magic, version (4 bytes each), then the backing file's
	// offset (8 bytes, big endian; 0 for none).
	var h [16]byte
	if _, err := io.ReadFull(fh, h[:]); err != nil {
		return false, fmt.Errorf("reading the disk header of %s: %w", st.Name, err)
	}
	if string(h[:4]) != "QFI\xfb" {
		return false, nil
	}
	return binary.BigEndian.Uint64(h[8:16]) != 0, nil
}
