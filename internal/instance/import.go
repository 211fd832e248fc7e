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
	fmt.Fprintf(&b, "importing %s: the archive widens the sandbox beyond a fresh `abox create`:", e.File)
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
// network identity is allocated fresh. On any failure nothing is left.
func (m *Manager) Import(ctx context.Context, file string, o ImportOptions) (st State, warnings []string, err error) {
	fh, err := openRegular(file)
	if err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	defer fh.Close()
	rd, err := archive.NewReader(fh)
	if err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	man := rd.Manifest()
	var src State
	dec := json.NewDecoder(bytes.NewReader(man.State))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&src); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: reading the instance state: %w (an archive of another abox version?)", file, err)
	}
	name := o.Name
	if name == "" {
		name = src.Name
	}
	if err := validate.InstanceName(name); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w (give another with --name)", file, err)
	}
	if err := m.importCollision(ctx, name); err != nil {
		return State{}, nil, err
	}
	has := map[string]bool{}
	for _, f := range man.Files {
		has[f.Name] = true
	}
	if st, err = importedState(m, src, name, has, o.UpstreamProxyCredentials); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	f := m.Layout.Instance(name)

	var undo undoStack
	defer func() {
		if err != nil {
			if uerr := undo.run(context.WithoutCancel(ctx)); uerr != nil {
				err = fmt.Errorf("%w (and rolling back: %v)", err, uerr)
			}
		}
	}()
	for _, d := range []string{m.Layout.Root, m.Layout.Instances()} {
		if err = os.MkdirAll(d, 0o711); err != nil {
			return State{}, nil, err
		}
	}
	// Everything is unpacked into a staging directory that no listing
	// takes for an instance (names start with a letter), renamed into
	// place under the global lock once it all checked out.
	m.sweepStaging()
	stage, err := os.MkdirTemp(m.Layout.Instances(), stagingPrefix+"*")
	if err != nil {
		return State{}, nil, err
	}
	undo.push("remove staging directory", func(context.Context) error { return os.RemoveAll(stage) })
	// Held until the import ends: a later import removes only staging
	// directories whose lock it can take (left by a killed import).
	unlockStage, err := lockFile(filepath.Join(stage, ".lock"))
	if err != nil {
		return State{}, nil, err
	}
	defer unlockStage()
	staged := func(p string) string { return filepath.Join(stage, strings.TrimPrefix(p, f.Dir)) }
	for _, d := range []struct {
		path string
		qemu bool
	}{{stage, true}, {staged(f.LogsDir), true}, {staged(f.BootDir), true}, {staged(filepath.Dir(f.SSHKey)), false}, {staged(f.RunDir), false}, {staged(f.CADir), false}} {
		if d.qemu {
			err = makeQEMUDir(d.path)
		} else {
			err = makePrivateDir(d.path)
		}
		if err != nil {
			return State{}, nil, err
		}
	}

	targets := map[string]string{}
	for _, af := range m.archiveFiles(st) {
		targets[af.name] = staged(af.path)
	}
	bundleTmp := filepath.Join(stage, archive.MonitorBundle)
	if st.MonitorBundle != nil {
		targets[archive.MonitorBundle] = bundleTmp
	}
	for {
		ent, r, nerr := rd.Next()
		if errors.Is(nerr, io.EOF) {
			break
		}
		if nerr != nil {
			return State{}, nil, fmt.Errorf("importing %s: %w", file, nerr)
		}
		if archive.IsDisk(ent.Name) {
			// The disk is last: decide on trust before reading gigabytes.
			if err = m.checkTrust(file, st, staged(f.Allowlist), o.Trust); err != nil {
				return State{}, nil, err
			}
			if err = checkDiskEntry(stage, ent, st.DiskGiB); err != nil {
				return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
			}
			targets[ent.Name] = filepath.Join(stage, ent.Name)
			r = m.progressReader(ctx, r, "importing "+name+": disk", ent.Size)
		}
		dst, ok := targets[ent.Name]
		if !ok {
			return State{}, nil, fmt.Errorf("importing %s: the archive carries %s, which the instance's state does not use", file, ent.Name)
		}
		if err = writeNewFile(dst, r); err != nil {
			return State{}, nil, fmt.Errorf("importing %s: %s: %w", file, ent.Name, err)
		}
		delete(targets, ent.Name)
	}
	delete(targets, archive.DiskQCOW2)
	delete(targets, archive.DiskRaw)
	for n := range targets {
		return State{}, nil, fmt.Errorf("importing %s: the archive lacks %s, which the instance's state needs", file, n)
	}

	disk := man.Files[len(man.Files)-1]
	if err = m.checkDisk(ctx, filepath.Join(stage, disk.Name), disk.Name, st.DiskGiB); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	if disk.Name == archive.DiskRaw {
		if _, err = m.Run.Run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", filepath.Join(stage, disk.Name), staged(f.Disk)); err != nil {
			return State{}, nil, fmt.Errorf("importing %s: converting the raw disk: %w", file, err)
		}
		if err = os.Remove(filepath.Join(stage, disk.Name)); err != nil {
			return State{}, nil, err
		}
	} else if err = os.Rename(filepath.Join(stage, disk.Name), staged(f.Disk)); err != nil {
		return State{}, nil, err
	}
	if err = os.Chmod(staged(f.Disk), PrivateFile); err != nil {
		return State{}, nil, err
	}

	if st.UpstreamCA != "" {
		b, rerr := os.ReadFile(staged(st.UpstreamCA))
		if rerr != nil || !x509.NewCertPool().AppendCertsFromPEM(b) {
			err = fmt.Errorf("importing %s: %s holds no PEM certificate", file, archive.UpstreamCA)
			return State{}, nil, err
		}
	}
	var in SeedInput
	if in.AuthorizedKey, err = importSSHKey(staged(f.SSHKey), "abox-"+name); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	authority, err := ca.New(ca.Config{Dir: staged(f.CADir)})
	if err == nil {
		in.CACertPEM, err = authority.CertPEM()
	}
	if err != nil {
		return State{}, nil, fmt.Errorf("importing %s: the instance CA: %w", file, err)
	}
	if st.MonitorBundle != nil {
		if err = m.importBundle(st.MonitorBundle, bundleTmp, &undo); err != nil {
			return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
		}
	}

	unlock, err := globalLock(m.Layout)
	if err != nil {
		return State{}, nil, err
	}
	defer unlock()
	if err = m.importCollision(ctx, name); err != nil {
		return State{}, nil, err
	}
	if st.Subnet, err = m.allocateSubnet(ctx, netip.Prefix{}); err != nil {
		return State{}, nil, err
	}
	st.Gateway, st.GuestIP = libvirt.InstanceAddresses(st.Subnet)
	if st.Bridge, err = m.allocateBridge(name); err != nil {
		return State{}, nil, err
	}
	if st.MAC, err = m.allocateMAC(); err != nil {
		return State{}, nil, err
	}
	if err = st.validate(m.Layout); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	// A directory without state is an interrupted create or import; it
	// holds nothing of value (as in Create).
	if err = os.RemoveAll(f.Dir); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: clearing an interrupted create: %w", file, err)
	}
	if err = os.Rename(stage, f.Dir); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: %w", file, err)
	}
	undo.push("remove instance directory", func(context.Context) error { return os.RemoveAll(f.Dir) })
	m.progress("importing %s: subnet %s, bridge %s, accel %s", name, st.Subnet, st.Bridge, st.Accel)

	// A fresh host key (the old one lived only in the old seed), and a
	// seed for the new address: the new UUID gives a new cloud-init
	// instance-id, so the guest applies the new network and host key on
	// its first boot here.
	in.State = st
	if in.HostKeyPEM, in.HostPublicKey, err = newHostKey(); err != nil {
		return State{}, nil, err
	}
	if err = fsutil.WriteFileAtomic(f.KnownHosts, []byte(fmt.Sprintf("%s %s\n", st.GuestIP, in.HostPublicKey)), PrivateFile); err != nil {
		return State{}, nil, err
	}
	if err = m.Seeds.WriteSeed(ctx, f.Seed, in); err != nil {
		return State{}, nil, fmt.Errorf("importing %s: cloud-init seed: %w", file, err)
	}
	if err = os.Chmod(f.Seed, PrivateFile); err != nil {
		return State{}, nil, err
	}
	if warnings, err = m.define(ctx, st, &undo); err != nil {
		return State{}, nil, err
	}
	if err = Save(m.Layout, st); err != nil {
		return State{}, nil, err
	}
	return st, warnings, nil
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
		return fmt.Errorf("importing as %s: an instance of that name exists; import under another name with --name NEW (or remove it first: abox remove %s)", name, name)
	}
	if _, err := m.Hypervisor.State(ctx, libvirt.DomainName(name)); !errors.Is(err, libvirt.ErrNotFound) {
		if err != nil {
			return fmt.Errorf("importing as %s: %w", name, err)
		}
		return fmt.Errorf("importing as %s: libvirt already has a domain %s not known to abox (an interrupted create or import leaves one); remove it with `abox remove --force %s`, or import under another name with --name NEW", name, libvirt.DomainName(name), name)
	}
	return nil
}

// importBundle puts the carried monitor bundle into the host's agent
// cache, checked as any bundle is, and holds it to the state's checksum.
// A bundle the cache did not hold before is removed again on rollback.
func (m *Manager) importBundle(b *MonitorBundle, tmp string, undo *undoStack) error {
	cache := tetragon.Cache{Dir: m.Layout.AgentCache()}
	_, statErr := os.Stat(cache.Path(b.SHA256))
	path, info, err := cache.Import(tmp, b.Source)
	if err != nil {
		return err
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		undo.push("remove imported monitor bundle", func(context.Context) error { return os.Remove(path) })
	}
	if info.SHA256 != b.SHA256 {
		return fmt.Errorf("the monitor bundle's sha256 is %s, the state says %s", info.SHA256, b.SHA256)
	}
	b.Path, b.Prefix, b.Size, b.BPFObjects = path, info.Prefix, info.Size, info.BPFObjects
	return os.Remove(tmp)
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
