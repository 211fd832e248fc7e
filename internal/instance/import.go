package instance

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/steps"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/tetragon"
	"github.com/abox-dev/abox/internal/validate"
)

// ImportOptions are abox import's choices.
type ImportOptions struct {
	// Name is the new instance's name; empty keeps the archive's.
	Name string
	// Trust accepts settings that widen the sandbox beyond a fresh create
	// (see WideningError); without it such an archive is refused.
	Trust bool
	// UpstreamProxyCredentials is this host's USER:PASSWORD file for the
	// archive's upstream proxy. The archive's own path (one on the
	// exporting host) is never used: an archive whose proxy took
	// credentials needs this.
	UpstreamProxyCredentials string
}

// WideningError refuses an archive whose settings widen the sandbox
// beyond what a fresh `abox create` gives, as an untrusted abox.yaml is.
type WideningError struct {
	File      string
	Widenings []config.Widening
}

func (e *WideningError) Error() string {
	var b strings.Builder
	// Import's error names the file before this.
	b.WriteString("the archive widens the sandbox beyond a fresh `abox create`:")
	for _, w := range e.Widenings {
		// Why quotes the archive's values (a credentials path is any
		// string): nothing of it may steer the terminal.
		fmt.Fprintf(&b, "\n  %s: %s", w.Key, termtext.Clean(w.Why))
	}
	b.WriteString("\nimport it only if you trust where it came from: run again with --trust")
	return b.String()
}

// freshFields are the State fields an import never takes from the
// archive: the instance's identity and its network identity, allocated
// on this host as create allocates them.
var freshFields = []string{"Name", "UUID", "CreatedAt", "Subnet", "Gateway", "GuestIP", "Bridge", "MAC"}

// Import makes a new instance from the archive file, read as hostile
// input (see internal/archive): every entry is checked, the state is
// checked like create's flags, the disk must be a plain standalone qcow2
// or raw image, and settings that widen the sandbox need o.Trust. The
// network identity is allocated fresh. It runs as a list of steps (see
// internal/steps); on any failure nothing is left.
func (m *Manager) Import(ctx context.Context, file string, o ImportOptions) (st State, warnings []string, err error) {
	im := &importing{m: m, file: file, o: o}
	defer im.release()
	if _, err := m.runSteps(ctx, "importing "+file, im.steps()); err != nil {
		return State{}, nil, err
	}
	m.recordAudit(im.st.Name, AuditImport, map[string]any{"archive": file})
	return im.st, im.warnings, nil
}

// importing is one Import in progress: what its steps made so far.
type importing struct {
	m    *Manager
	file string
	o    ImportOptions

	fh    *os.File
	rd    *archive.Reader
	man   archive.Manifest
	name  string
	f     paths.Instance
	stage string // the staging directory, renamed to f.Dir at the end
	// bundleAdded is the monitor bundle this import put into the agent
	// cache (empty when the cache held it before, or none was carried).
	bundleAdded string
	releases    []func() // locks and files held until Import returns

	st       State
	in       SeedInput
	warnings []string
}

func (im *importing) release() {
	for i := len(im.releases) - 1; i >= 0; i-- {
		im.releases[i]()
	}
}

// staged is where p (a path of the instance's directory) is while staged.
func (im *importing) staged(p string) string {
	return filepath.Join(im.stage, strings.TrimPrefix(p, im.f.Dir))
}

func (im *importing) steps() []steps.Step {
	m := im.m
	list := []steps.Step{
		{Name: "open the archive", Do: im.open},
		{Name: "read the state", Do: im.readState},
		// Everything is unpacked into a staging directory that no listing
		// takes for an instance (names start with a letter), renamed into
		// place under the global lock once it all checked out.
		{Name: "staging directory", Do: im.makeStage,
			Undo: func(context.Context) error { return os.RemoveAll(im.stage) }},
		{Name: "staging layout", Do: im.stageLayout},
		{Name: "unpack", Do: im.unpack},
		{Name: "disk", Do: im.disk},
		{Name: "keys", Do: im.keys},
		// A bundle the cache did not hold before is removed again on rollback.
		{Name: "cache the monitor bundle", Do: im.cacheBundle,
			Undo: func(context.Context) error {
				if im.bundleAdded == "" {
					return nil
				}
				return os.Remove(im.bundleAdded)
			}},
		{Name: "take the global lock", Do: func(context.Context) error {
			unlock, err := globalLock(m.Layout)
			if err == nil {
				im.releases = append(im.releases, unlock)
			}
			return err
		}},
		{Name: "check the name", Do: func(ctx context.Context) error { return m.importCollision(ctx, im.name) }},
		{Name: "allocate addresses", Do: im.allocate},
		{Name: "move into place", Do: func(context.Context) error {
			// A directory without state is an interrupted create or import;
			// it holds nothing of value (as in Create).
			if err := os.RemoveAll(im.f.Dir); err != nil {
				return fmt.Errorf("clearing an interrupted create: %w", err)
			}
			if err := os.Rename(im.stage, im.f.Dir); err != nil {
				return err
			}
			m.progress("importing %s: subnet %s, bridge %s, accel %s", im.name, im.st.Subnet, im.st.Bridge, im.st.Accel)
			return nil
		}, Undo: func(context.Context) error { return os.RemoveAll(im.f.Dir) }},
		{Name: "host key", Do: func(context.Context) (err error) {
			// A fresh host key (the old one lived only in the old seed), and a
			// seed for the new address: the new UUID gives a new cloud-init
			// instance-id, so the guest applies the new network and host key on
			// its first boot here.
			im.in.State = im.st
			if im.in.HostKeyPEM, im.in.HostPublicKey, err = newHostKey(); err != nil {
				return err
			}
			return fsutil.WriteFileAtomic(im.f.KnownHosts, []byte(fmt.Sprintf("%s %s\n", im.st.GuestIP, im.in.HostPublicKey)), PrivateFile)
		}},
		{Name: "cloud-init seed", Do: func(ctx context.Context) error {
			if err := m.Seeds.WriteSeed(ctx, im.f.Seed, im.in); err != nil {
				return fmt.Errorf("cloud-init seed: %w", err)
			}
			return os.Chmod(im.f.Seed, PrivateFile)
		}},
	}
	list = append(list, m.defineSteps(&im.st, &im.warnings)...)
	return append(list, steps.Step{Name: "save the state", Do: func(context.Context) error { return Save(m.Layout, im.st) }})
}

func (im *importing) open(context.Context) (err error) {
	if im.fh, err = openRegular(im.file); err != nil {
		return err
	}
	im.releases = append(im.releases, func() { im.fh.Close() })
	if im.rd, err = archive.NewReader(im.fh); err != nil {
		return err
	}
	im.man = im.rd.Manifest()
	return nil
}

// readState decodes and checks the archive's state and its new name.
func (im *importing) readState(ctx context.Context) (err error) {
	var src State
	dec := json.NewDecoder(bytes.NewReader(im.man.State))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&src); err != nil {
		return fmt.Errorf("reading the instance state: %w (an archive of another abox version?)", err)
	}
	im.name = im.o.Name
	if im.name == "" {
		im.name = src.Name
	}
	if err := validate.InstanceName(im.name); err != nil {
		return fmt.Errorf("%w (give another with --name)", err)
	}
	if err := im.m.importCollision(ctx, im.name); err != nil {
		return err
	}
	has := map[string]bool{}
	for _, f := range im.man.Files {
		has[f.Name] = true
	}
	if im.st, err = importedState(im.m, src, im.name, has, im.o.UpstreamProxyCredentials); err != nil {
		return err
	}
	im.f = im.m.Layout.Instance(im.name)
	return nil
}

func (im *importing) makeStage(context.Context) (err error) {
	m := im.m
	for _, d := range []string{m.Layout.Root, m.Layout.Instances()} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
	}
	m.sweepStaging()
	im.stage, err = os.MkdirTemp(m.Layout.Instances(), stagingPrefix+"*")
	return err
}

func (im *importing) stageLayout(context.Context) error {
	// Held until the import ends: a later import removes only staging
	// directories whose lock it can take (left by a killed import).
	unlockStage, err := lockFile(filepath.Join(im.stage, ".lock"))
	if err != nil {
		return err
	}
	im.releases = append(im.releases, unlockStage)
	f, staged := im.f, im.staged
	for _, d := range []struct {
		path string
		qemu bool
	}{{im.stage, true}, {staged(f.LogsDir), true}, {staged(f.BootDir), true}, {staged(filepath.Dir(f.SSHKey)), false}, {staged(f.RunDir), false}, {staged(f.CADir), false}} {
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

// unpack writes every entry to its staged place; the disk, last, only
// once the trust check passed.
func (im *importing) unpack(ctx context.Context) error {
	m, st, f, staged := im.m, im.st, im.f, im.staged
	targets := map[string]string{}
	for _, af := range m.archiveFiles(st) {
		targets[af.name] = staged(af.path)
	}
	if st.MonitorBundle != nil {
		targets[archive.MonitorBundle] = im.bundleTmp()
	}
	for {
		ent, r, err := im.rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if archive.IsDisk(ent.Name) {
			// The disk is last: decide on trust before reading gigabytes.
			if err := m.checkTrust(im.file, st, staged(f.Allowlist), im.o.Trust); err != nil {
				return err
			}
			if err := checkDiskEntry(im.stage, ent, st.DiskGiB); err != nil {
				return err
			}
			targets[ent.Name] = filepath.Join(im.stage, ent.Name)
			r = m.progressReader(ctx, r, "importing "+im.name+": disk", ent.Size)
		}
		dst, ok := targets[ent.Name]
		if !ok {
			return fmt.Errorf("the archive carries %s, which the instance's state does not use", ent.Name)
		}
		if err := writeNewFile(dst, r); err != nil {
			return fmt.Errorf("%s: %w", ent.Name, err)
		}
		delete(targets, ent.Name)
	}
	delete(targets, archive.DiskQCOW2)
	delete(targets, archive.DiskRaw)
	for n := range targets {
		return fmt.Errorf("the archive lacks %s, which the instance's state needs", n)
	}
	return nil
}

func (im *importing) bundleTmp() string { return filepath.Join(im.stage, archive.MonitorBundle) }

// disk checks the unpacked disk and makes it the staged instance's qcow2.
func (im *importing) disk(ctx context.Context) error {
	m, st, stage, target := im.m, im.st, im.stage, im.staged(im.f.Disk)
	disk := im.man.Files[len(im.man.Files)-1]
	if err := m.checkDisk(ctx, filepath.Join(stage, disk.Name), disk.Name, st.DiskGiB); err != nil {
		return err
	}
	if disk.Name == archive.DiskRaw {
		if _, err := m.Run.Run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", filepath.Join(stage, disk.Name), target); err != nil {
			return fmt.Errorf("converting the raw disk: %w", err)
		}
		if err := os.Remove(filepath.Join(stage, disk.Name)); err != nil {
			return err
		}
	} else if err := os.Rename(filepath.Join(stage, disk.Name), target); err != nil {
		return err
	}
	return os.Chmod(target, PrivateFile)
}

// keys checks the carried upstream CA, user key and instance CA.
func (im *importing) keys(context.Context) (err error) {
	if im.st.UpstreamCA != "" {
		b, rerr := os.ReadFile(im.staged(im.st.UpstreamCA))
		if rerr != nil || !x509.NewCertPool().AppendCertsFromPEM(b) {
			return fmt.Errorf("%s holds no PEM certificate", archive.UpstreamCA)
		}
	}
	if im.in.AuthorizedKey, err = importSSHKey(im.staged(im.f.SSHKey), "abox-"+im.name); err != nil {
		return err
	}
	authority, err := ca.New(ca.Config{Dir: im.staged(im.f.CADir)})
	if err == nil {
		im.in.CACertPEM, err = authority.CertPEM()
	}
	if err != nil {
		return fmt.Errorf("the instance CA: %w", err)
	}
	return nil
}

// allocate gives the state a subnet, bridge and MAC of this host, as
// create does, and checks it whole.
func (im *importing) allocate(ctx context.Context) (err error) {
	m, st := im.m, &im.st
	if st.Subnet, err = m.allocateSubnet(ctx, netip.Prefix{}); err != nil {
		return err
	}
	st.Gateway, st.GuestIP = libvirt.InstanceAddresses(st.Subnet)
	if st.Bridge, err = m.allocateBridge(im.name); err != nil {
		return err
	}
	if st.MAC, err = m.allocateMAC(); err != nil {
		return err
	}
	return st.validate(m.Layout)
}

// stagingPrefix names import staging directories under instances/ (no
// instance name starts with a dot, so no listing takes one for an instance).
const stagingPrefix = ".import-"

// sweepStaging removes the staging directories of imports that were
// killed (their lock is free); those of running imports stay.
func (m *Manager) sweepStaging() {
	ents, err := os.ReadDir(m.Layout.Instances())
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), stagingPrefix) {
			continue
		}
		dir := filepath.Join(m.Layout.Instances(), e.Name())
		// Young ones may be between MkdirTemp and their lock.
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < time.Minute {
			continue
		}
		fh, err := os.Open(filepath.Join(dir, ".lock"))
		if err != nil {
			continue // being created, or not ours: leave it
		}
		if syscall.Flock(int(fh.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			m.progress("importing: removing %s, left by an interrupted import", dir)
			os.RemoveAll(dir)
		}
		fh.Close()
	}
}

// importCollision refuses a name that an instance or a libvirt domain has.
func (m *Manager) importCollision(ctx context.Context, name string) error {
	if _, err := os.Stat(m.Layout.Instance(name).State); err == nil {
		return fmt.Errorf("as %s: %w", name, &NameTakenError{Name: name, Import: true})
	}
	dom := libvirt.DomainName(name)
	if _, err := m.Hypervisor.State(ctx, dom); !errors.Is(err, libvirt.ErrNotFound) {
		if err != nil {
			return fmt.Errorf("as %s: %w", name, err)
		}
		return fmt.Errorf("as %s: %w", name, &DomainTakenError{Name: name, Domain: dom, Import: true})
	}
	return nil
}

// cacheBundle puts the carried monitor bundle into the host's agent
// cache, checked as any bundle is, and holds it to the state's checksum.
// A bundle the cache did not hold before is left in im.bundleAdded, for
// the step's undo (and removed here when the checksum is refused).
func (im *importing) cacheBundle(context.Context) error {
	b := im.st.MonitorBundle
	if b == nil {
		return nil
	}
	cache := tetragon.Cache{Dir: im.m.Layout.AgentCache()}
	_, statErr := os.Stat(cache.Path(b.SHA256))
	path, info, err := cache.Import(im.bundleTmp(), b.Source)
	if err != nil {
		return err
	}
	// A failed step leaves no bundle it added in the cache.
	fail := func(err error) error {
		if errors.Is(statErr, fs.ErrNotExist) {
			if rerr := os.Remove(path); rerr != nil {
				err = fmt.Errorf("%w (and removing it from the agent cache: %v)", err, rerr)
			}
		}
		return err
	}
	if info.SHA256 != b.SHA256 {
		return fail(fmt.Errorf("the monitor bundle's sha256 is %s, the state says %s", info.SHA256, b.SHA256))
	}
	if err := os.Remove(im.bundleTmp()); err != nil {
		return fail(err)
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		im.bundleAdded = path
	}
	b.Path, b.Prefix, b.Size, b.BPFObjects = path, info.Prefix, info.Size, info.BPFObjects
	return nil
}

// writeNewFile writes r to a new file at path (0600, never through an
// existing file or link).
func writeNewFile(path string, r io.Reader) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, PrivateFile)
	if err != nil {
		return err
	}
	if _, err := io.Copy(fh, r); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

// openRegular opens a regular file for reading (never blocking on a FIFO).
func openRegular(file string) (*os.File, error) {
	fh, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := fh.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file", file)
	}
	if err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}
