package instance

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/libvirt"
)

// ExportResult is what an export wrote.
type ExportResult struct {
	Path string `json:"path"`
	// Size is the archive's size; DiskBytes the flattened disk's inside it.
	Size      int64         `json:"size"`
	DiskBytes int64         `json:"disk_bytes"`
	Duration  time.Duration `json:"duration_ns"`
}

// archiveFile pairs an archive entry with the instance file it carries.
type archiveFile struct{ name, path string }

// archiveFiles are the entries of st's archive, the disk left out: the
// allowlist, the CA and the SSH key always; the upstream CA, the kernel
// and initrd of direct kernel boot, and the monitor bundle when st has
// them. Import maps the same names back (importTarget).
func (m *Manager) archiveFiles(st State) []archiveFile {
	f := m.Layout.Instance(st.Name)
	out := []archiveFile{
		{archive.Allowlist, f.Allowlist},
		{archive.CACert, filepath.Join(f.CADir, ca.CertFile)},
		{archive.CAKey, filepath.Join(f.CADir, ca.KeyFile)},
		{archive.SSHKey, f.SSHKey},
	}
	if st.UpstreamCA != "" {
		out = append(out, archiveFile{archive.UpstreamCA, st.UpstreamCA})
	}
	if st.Kernel != "" {
		out = append(out, archiveFile{archive.Kernel, st.Kernel})
	}
	if st.Initrd != "" {
		out = append(out, archiveFile{archive.Initrd, st.Initrd})
	}
	if st.MonitorBundle != nil {
		out = append(out, archiveFile{archive.MonitorBundle, st.MonitorBundle.Path})
	}
	return out
}

// Export writes instance name to the archive dest: its state, allowlist,
// keys, the files its settings name, and its disk flattened onto its base
// (a standalone qcow2, so the archive needs no base image to import). The
// instance must be shut off, and stays locked meanwhile so that nothing
// starts it. dest must not exist; it appears only when complete.
func (m *Manager) Export(ctx context.Context, name, dest string) (res ExportResult, err error) {
	began := time.Now()
	unlock, err := lockInstance(m.Layout, name)
	if err != nil {
		return res, err
	}
	defer unlock()
	st, err := Load(m.Layout, name)
	if err != nil {
		return res, err
	}
	state, err := m.Hypervisor.State(ctx, libvirt.DomainName(name))
	if err != nil && !errors.Is(err, libvirt.ErrNotFound) {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}
	if err == nil && state != libvirt.StateShutoff {
		// A running guest's disk changes under the copy: the archive would
		// hold a torn file system.
		return res, fmt.Errorf("exporting %s: it is %s; stop it first (abox stop %s)", name, state, name)
	}
	if dest, err = filepath.Abs(dest); err != nil {
		return res, err
	}
	if _, err := os.Lstat(dest); err == nil {
		return res, fmt.Errorf("exporting %s: %s exists; remove it or name another file with -o", name, dest)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}

	work, err := os.MkdirTemp(filepath.Dir(dest), ".abox-export-*")
	if err != nil {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, PrivateDir); err != nil {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}
	if err := m.checkOverlay(ctx, st); err != nil {
		return res, fmt.Errorf("exporting %s: %w", name, err)
	}
	disk := filepath.Join(work, archive.DiskQCOW2)
	m.progress("exporting %s: flattening the disk onto its base (qemu-img convert)", name)
	stopWatch := m.watchSize(disk, "exporting "+name+": flattened")
	_, err = m.Run.Run(ctx, "qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", m.Layout.Instance(name).Disk, disk)
	stopWatch()
	if err != nil {
		return res, fmt.Errorf("exporting %s: flattening the disk: %w", name, err)
	}

	files := append(m.archiveFiles(st), archiveFile{archive.DiskQCOW2, disk})
	var man archive.Manifest
	if man.State, err = json.Marshal(st); err != nil {
		return res, err
	}
	for _, af := range files {
		fi, err := os.Stat(af.path)
		if err != nil {
			return res, fmt.Errorf("exporting %s: %w", name, err)
		}
		man.Files = append(man.Files, archive.File{Name: af.name, Size: fi.Size()})
	}
	res.DiskBytes = man.Files[len(man.Files)-1].Size
	w, err := archive.Create(dest, man)
	if err != nil {
		return res, err
	}
	defer func() {
		if err != nil {
			w.Abort()
		}
	}()
	for _, af := range files {
		if err = ctx.Err(); err != nil {
			return res, err
		}
		if err = m.addFile(ctx, w, af, name); err != nil {
			return res, err
		}
	}
	if err = w.Commit(); err != nil {
		return res, err
	}
	fi, err := os.Stat(dest)
	if err != nil {
		return res, err
	}
	res.Path, res.Size, res.Duration = dest, fi.Size(), time.Since(began)
	m.recordAudit(name, AuditExport, map[string]any{"path": dest, "size": res.Size})
	return res, nil
}

func (m *Manager) addFile(ctx context.Context, w *archive.Writer, af archiveFile, name string) error {
	fh, err := os.Open(af.path)
	if err != nil {
		return fmt.Errorf("exporting %s: %w", name, err)
	}
	defer fh.Close()
	var r io.Reader = fh
	if archive.IsDisk(af.name) {
		fi, err := fh.Stat()
		if err != nil {
			return err
		}
		r = m.progressReader(ctx, fh, "exporting "+name+": disk", fi.Size())
	}
	return w.Add(af.name, r)
}

// progressReader reports how much of total has been read, at most once a
// second and at the end, and stops reading once ctx is done (an
// interrupted export or import of gigabytes ends at once, and rolls back).
func (m *Manager) progressReader(ctx context.Context, r io.Reader, what string, total int64) io.Reader {
	return &progress{ctx: ctx, r: r, what: what, total: total, report: m.progress}
}

type progress struct {
	ctx    context.Context
	r      io.Reader
	what   string
	total  int64
	done   int64
	last   time.Time
	report func(string, ...any)
}

func (p *progress) Read(b []byte) (int, error) {
	if err := p.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := p.r.Read(b)
	p.done += int64(n)
	if now := time.Now(); now.Sub(p.last) >= time.Second || p.done == p.total && n > 0 {
		p.last = now
		pct := 100.0
		if p.total > 0 {
			pct = float64(p.done) * 100 / float64(p.total)
		}
		p.report("%s %s of %s (%.0f%%)", p.what, mib(p.done), mib(p.total), pct)
	}
	return n, err
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// watchSize reports the size of the file path every few seconds until the
// returned function is called (qemu-img's own progress needs a terminal).
func (m *Manager) watchSize(path, what string) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(3 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if fi, err := os.Stat(path); err == nil {
					m.progress("%s %s so far", what, mib(fi.Size()))
				}
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// checkOverlay refuses an overlay whose header names a backing file other
// than its base's disk (BackingPath): qemu-img convert follows the chain
// the header names, and would put that host file, read as the guest's
// disk, into the archive. The base itself stands alone.
func (m *Manager) checkOverlay(ctx context.Context, st State) error {
	f := m.Layout.Instance(st.Name)
	info, err := m.diskInfo(ctx, f.Disk, "qcow2")
	if err != nil {
		return fmt.Errorf("reading the disk's header: %w", err)
	}
	want := BackingPath(m.Layout, st)
	switch {
	case info.BackingFilename == "":
		return nil // imported: the disk stands alone
	case info.BackingFilename != want || (info.FullBacking != "" && info.FullBacking != want):
		return fmt.Errorf("the disk %s names the backing file %q, not its base's disk %s; abox did not write that header, so nothing is exported (see docs/images.md)", f.Disk, info.BackingFilename, want)
	case info.BackingFormat != "qcow2":
		return fmt.Errorf("the disk %s reads its base %s as %q, not qcow2; nothing is exported", f.Disk, want, info.BackingFormat)
	}
	base, err := m.diskInfo(ctx, want, "qcow2")
	if err != nil {
		return fmt.Errorf("reading the base's header: %w", err)
	}
	if base.BackingFilename != "" || base.Specific.Data.DataFile != "" {
		return fmt.Errorf("the base %s names a backing or data file of its own (%q); a base stands alone, so nothing is exported", want, base.BackingFilename+base.Specific.Data.DataFile)
	}
	return nil
}
