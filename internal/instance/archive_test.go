package instance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/archive"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/tetragon/tetragontest"
)

// qemuRun runs the real qemu-img and qemu-io (the disk checks are the
// point of these tests) and answers `ip -j route`.
type qemuRun struct{}

func (qemuRun) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name == "ip" {
		return []byte(`[{"dst":"default"}]`), nil
	}
	if name != "qemu-img" && name != "qemu-io" {
		return nil, fmt.Errorf("unexpected command %s", name)
	}
	return cloudinit.ExecRunner{}.Run(ctx, name, args...)
}

// bootImages has one base, debian-12, a real qcow2 with direct kernel boot
// (kernel, initrd, command line), as the debootstrap build makes.
type bootImages struct{ dir string }

func (b bootImages) Get(name string) (image.Image, error) {
	if name != "debian-12" || b.dir == "" {
		return image.Image{}, fmt.Errorf("reading image %s: %w", name, image.ErrNotFound)
	}
	return image.Image{Metadata: image.Metadata{Name: name, Boot: &image.Boot{Kernel: image.KernelFile, Initrd: image.InitrdFile, Cmdline: "console=ttyS0 root=/dev/vda rw"}}, Dir: b.dir}, nil
}

func needQEMUImg(t *testing.T) {
	t.Helper()
	for _, p := range []string{"qemu-img", "qemu-io"} {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s not installed (apt-get install qemu-utils)", p)
		}
	}
}

func qemu(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return string(out)
}

// archiveRig is a rig whose base image is real: a qcow2 with a pattern
// written into it, a kernel and an initrd.
func archiveRig(t *testing.T) *rig {
	t.Helper()
	needQEMUImg(t)
	r := newRig(t)
	dir := filepath.Join(r.m.Layout.Images(), "debian-12")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, image.DiskFile)
	qemu(t, "qemu-img", "create", "-q", "-f", "qcow2", base, "64M")
	qemu(t, "qemu-io", "-c", "write -q -P 0x11 0 64k", base)
	os.WriteFile(filepath.Join(dir, image.KernelFile), []byte("a kernel"), 0o644)
	os.WriteFile(filepath.Join(dir, image.InitrdFile), []byte("an initrd"), 0o644)
	r.m.Images, r.m.Run = bootImages{dir: dir}, qemuRun{}
	return r
}

// fullSpec sets every setting create has, so that the instance's state
// has no zero field for the round trip to hide behind.
func fullSpec(t *testing.T) Spec {
	t.Helper()
	d := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(d, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	other, err := ca.New(ca.Config{Dir: filepath.Join(d, "other-ca")})
	if err != nil {
		t.Fatal(err)
	}
	otherPEM, err := other.CertPEM()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{
		Name: "dev", CPUs: 3, MemoryMiB: 1536, DiskGiB: 1, User: "agent", Accel: "tcg",
		Upstreams:      []string{"192.0.2.53:53"},
		AllowPrivate:   []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		AllowHost:      []netip.Prefix{netip.MustParsePrefix("192.0.2.7/32")},
		Allowlist:      write("allow.txt", "example.com\n*.pkg.example.org\n"),
		NoMITM:         true,
		MITMExceptions: []string{"pinned.example.com"},
		Ports:          []uint16{80, 443, 8443},
		MetricsListen:  "127.0.0.1:9153",
		Template: write("domain.xml", `<domain type='{{.DomainType}}'><name>{{.DomainName}}</name><uuid>{{.UUID}}</uuid><memory unit='MiB'>{{.MemoryMiB}}</memory><vcpu>{{.CPUs}}</vcpu><os><type arch='x86_64'>hvm</type></os>
<devices><disk type='file' device='disk'><source file='{{.DiskPath}}'/><target dev='vda' bus='virtio'/></disk>
<interface type='network'><mac address='{{.MAC}}'/><source network='{{.NetworkName}}'/><filterref filter='{{.FilterName}}'/></interface></devices></domain>`),
		UpstreamCA:               write("upstream.pem", string(otherPEM)),
		UpstreamProxy:            "http://192.0.2.1:3128",
		UpstreamProxyCredentials: write("proxy-creds", "u:p\n"),
		MonitorBundle:            writeBundleFile(t, d),
	}
}

// hostCredentials writes the importing host's proxy credentials file, the
// one fullSpec's archive needs (--upstream-proxy-credentials).
func hostCredentials(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "this-host-creds")
	if err := os.WriteFile(p, []byte("u2:p2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeBundleFile writes a bundle below a top directory, as upstream's
// tarball is (so the state's Prefix is set too).
func writeBundleFile(t *testing.T, dir string) string {
	p := filepath.Join(dir, "bundle.tar.gz")
	files := map[string]string{}
	for k, v := range tetragontest.Agent {
		files["tetragon-v1.7.1-amd64/"+k] = v
	}
	if err := os.WriteFile(p, tetragontest.Tarball(files), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// nonZero fails for every zero field of v, recursively through pointers
// and structs: a new State field must be given a value in fullSpec (and
// so be carried by the round trip) before this test passes.
func nonZero(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	if v.IsZero() {
		t.Errorf("%s is zero in the exported state: set it in fullSpec so the round trip covers it", path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		nonZero(t, path, v.Elem())
	case reflect.Struct:
		if v.Type().PkgPath() != "github.com/abox-dev/abox/internal/instance" {
			return // netip, time: opaque values
		}
		for i := range v.NumField() {
			nonZero(t, path+"."+v.Type().Field(i).Name, v.Field(i))
		}
	}
}

// TestExportImportKeepsEverySetting exports an instance with every setting
// set and imports it as dev2: the state is the same field by field except
// the fresh ones (identity and network, all different) and the paths of
// its own files; keys, CA, allowlist, kernel and disk content are the
// same bytes, every file is 0600, and the disk stands alone.
func TestExportImportKeepsEverySetting(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, fullSpec(t)); err != nil {
		t.Fatal(err)
	}
	f1 := r.m.Layout.Instance("dev")
	qemu(t, "qemu-io", "-c", "write -q -P 0xab 1M 64k", f1.Disk)
	// A snapshot (abox snapshot keeps them inside the qcow2) stays behind:
	// export flattens the current state only, which import requires.
	qemu(t, "qemu-img", "snapshot", "-c", "s1", f1.Disk)
	qemu(t, "qemu-io", "-c", "write -q -P 0xcd 2M 64k", f1.Disk)
	src, err := Load(r.m.Layout, "dev")
	if err != nil {
		t.Fatal(err)
	}
	nonZero(t, "State", reflect.ValueOf(src))

	out := filepath.Join(t.TempDir(), "dev.abox")
	res, err := r.m.Export(ctx, "dev", out)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != res.Size {
		t.Fatalf("archive %v, %v; result %+v", fi, err, res)
	}
	if ents, _ := os.ReadDir(filepath.Dir(out)); len(ents) != 1 {
		t.Errorf("export left %v next to the archive", ents)
	}
	if got := auditKinds(t, r.m); len(got) == 0 || got[0] != AuditExport {
		t.Errorf("audit records after the export %v, want the export", got)
	}

	// The credentials file is a path on the exporting host: the import
	// never reads it and asks for this host's.
	creds := hostCredentials(t)
	if _, _, err := r.m.Import(ctx, out, ImportOptions{Name: "dev2", Trust: true}); err == nil || !strings.Contains(err.Error(), "--upstream-proxy-credentials FILE") || !strings.Contains(err.Error(), src.UpstreamProxyCredentials) {
		t.Fatalf("import of an archive whose proxy took credentials, without this host's = %v", err)
	}
	assertNothingLeft(t, r, "dev2")
	var we *WideningError
	if _, _, err := r.m.Import(ctx, out, ImportOptions{Name: "dev2", UpstreamProxyCredentials: creds}); !errors.As(err, &we) {
		t.Fatalf("import without --trust of a widening archive = %v", err)
	}
	assertNothingLeft(t, r, "dev2")
	got, _, err := r.m.Import(ctx, out, ImportOptions{Name: "dev2", Trust: true, UpstreamProxyCredentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	if loaded, err := Load(r.m.Layout, "dev2"); err != nil || !reflect.DeepEqual(loaded, got) {
		t.Fatalf("saved state %+v, %v; want %+v", loaded, err, got)
	}
	f2 := r.m.Layout.Instance("dev2")

	want := src
	wv, gv, sv := reflect.ValueOf(&want).Elem(), reflect.ValueOf(got), reflect.ValueOf(src)
	for _, name := range freshFields {
		if reflect.DeepEqual(sv.FieldByName(name).Interface(), gv.FieldByName(name).Interface()) {
			t.Errorf("%s = %v was carried; it must be fresh", name, gv.FieldByName(name))
		}
		wv.FieldByName(name).Set(gv.FieldByName(name))
	}
	want.UpstreamCA, want.Kernel, want.Initrd = filepath.Join(f2.Dir, "upstream-ca.pem"), f2.Kernel, f2.Initrd
	want.UpstreamProxyCredentials = creds
	if !reflect.DeepEqual(got, want) {
		a, _ := json.MarshalIndent(got, "", " ")
		b, _ := json.MarshalIndent(want, "", " ")
		t.Errorf("imported state\n%s\nwant\n%s", a, b)
	}

	for _, p := range [][2]string{
		{f1.Allowlist, f2.Allowlist}, {f1.SSHKey, f2.SSHKey},
		{filepath.Join(f1.CADir, ca.KeyFile), filepath.Join(f2.CADir, ca.KeyFile)},
		{filepath.Join(f1.CADir, ca.CertFile), filepath.Join(f2.CADir, ca.CertFile)},
		{src.UpstreamCA, got.UpstreamCA}, {src.Kernel, got.Kernel}, {src.Initrd, got.Initrd},
	} {
		a, _ := os.ReadFile(p[0])
		b, err := os.ReadFile(p[1])
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("%s differs from %s (%v)", p[1], p[0], err)
		}
	}
	filepath.WalkDir(f2.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, _ := d.Info(); fi.Mode().Perm() != PrivateFile {
				t.Errorf("%s is %v, want 0600", p, fi.Mode().Perm())
			}
		}
		return nil
	})
	qemu(t, "qemu-img", "compare", "-q", f1.Disk, f2.Disk)
	if info := qemu(t, "qemu-img", "info", "--output=json", f2.Disk); strings.Contains(info, "backing") {
		t.Errorf("the imported disk has a backing file: %s", info)
	}
	if _, err := r.hv.State(ctx, libvirt.DomainName("dev2")); err != nil {
		t.Errorf("dev2 has no domain: %v", err)
	}
	// The base may go: dev uses it, dev2 (flattened, its own kernel) not.
	for _, c := range []struct {
		st   State
		want bool
	}{{src, true}, {got, false}} {
		if uses, err := UsesBase(r.m.Layout, c.st); err != nil || uses != c.want {
			t.Errorf("UsesBase(%s) = %v, %v; want %v", c.st.Name, uses, err, c.want)
		}
	}
	noKernel := src
	noKernel.Kernel = ""
	if uses, err := UsesBase(r.m.Layout, noKernel); err != nil || !uses {
		t.Errorf("UsesBase of an overlay disk = %v, %v; want true", uses, err)
	}

	// The archive's name is taken: the error says so as a fact (the CLI's
	// hint names --name; see cli.TestFactHints).
	var taken *NameTakenError
	if _, _, err := r.m.Import(ctx, out, ImportOptions{Trust: true, UpstreamProxyCredentials: creds}); !errors.As(err, &taken) || taken.Name != "dev" || !taken.Import {
		t.Errorf("import over an existing name = %v, want a NameTakenError of dev from an import", err)
	}
}

// TestImportNeedsNoBase: on a host without the base image (nor the
// monitor bundle in its cache) the archive imports and carries both.
func TestImportNeedsNoBase(t *testing.T) {
	a := archiveRig(t)
	ctx := context.Background()
	if _, _, err := a.m.Create(ctx, fullSpec(t)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dev.abox")
	if _, err := a.m.Export(ctx, "dev", out); err != nil {
		t.Fatal(err)
	}
	b := newRig(t)
	b.m.Images, b.m.Run = bootImages{}, qemuRun{}
	st, _, err := b.m.Import(ctx, out, ImportOptions{Trust: true, UpstreamProxyCredentials: hostCredentials(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(st.MonitorBundle.Path); err != nil || filepath.Dir(st.MonitorBundle.Path) != b.m.Layout.AgentCache() {
		t.Errorf("monitor bundle %s: %v", st.MonitorBundle.Path, err)
	}
	qemu(t, "qemu-img", "compare", "-q", a.m.Layout.Instance("dev").Disk, b.m.Layout.Instance("dev").Disk)
}

// TestExportRefusesARunningInstance: the disk would change under the copy.
func TestExportRefusesARunningInstance(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg", DiskGiB: 1}); err != nil {
		t.Fatal(err)
	}
	r.hv.domains[libvirt.DomainName("dev")] = libvirt.StateRunning
	dir := t.TempDir()
	if _, err := r.m.Export(ctx, "dev", filepath.Join(dir, "dev.abox")); err == nil || !strings.Contains(err.Error(), "abox stop dev") {
		t.Fatalf("export of a running instance = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("a refused export left %v", ents)
	}
}

// TestExportFollowsOnlyTheBase: an overlay whose header names another
// backing file (a host file, another base, the base read as raw) is not
// exported: qemu-img convert would copy that file into the archive as the
// guest's disk. A standalone disk (an imported instance's) is exported.
func TestExportFollowsOnlyTheBase(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg", DiskGiB: 1}); err != nil {
		t.Fatal(err)
	}
	disk := r.m.Layout.Instance("dev").Disk
	base := filepath.Join(r.m.Layout.Images(), "debian-12", image.DiskFile)
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, bytes.Repeat([]byte("host secret "), 1<<12), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(t.TempDir(), "other.qcow2")
	qemu(t, "qemu-img", "create", "-q", "-f", "qcow2", other, "64M")
	chained := filepath.Join(t.TempDir(), "chained.qcow2")
	qemu(t, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", secret, chained, "64M")
	for _, tc := range []struct{ name, backing, format, want string }{
		{"a host file", secret, "raw", "not its base's disk"},
		{"another qcow2", other, "qcow2", "not its base's disk"},
		{"the base read as raw", base, "raw", "not qcow2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			qemu(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-F", tc.format, "-b", tc.backing, disk)
			dir := t.TempDir()
			if _, err := r.m.Export(ctx, "dev", filepath.Join(dir, "dev.abox")); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("export = %v, want %q", err, tc.want)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("a refused export left %v", ents)
			}
		})
	}
	t.Run("a base with a chain of its own", func(t *testing.T) {
		saved, err := os.ReadFile(base)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.WriteFile(base, saved, 0o644) })
		qemu(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", chained, base)
		qemu(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", base, disk)
		if _, err := r.m.Export(ctx, "dev", filepath.Join(t.TempDir(), "dev.abox")); err == nil || !strings.Contains(err.Error(), "a base stands alone") {
			t.Fatalf("export = %v, want the base's own chain refused", err)
		}
	})
	t.Run("a standalone disk", func(t *testing.T) {
		qemu(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-b", "", disk)
		if _, err := r.m.Export(ctx, "dev", filepath.Join(t.TempDir(), "dev.abox")); err != nil {
			t.Fatalf("export of a standalone disk: %v", err)
		}
	})
	t.Run("its base", func(t *testing.T) {
		qemu(t, "qemu-img", "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", base, disk)
		if _, err := r.m.Export(ctx, "dev", filepath.Join(t.TempDir(), "dev.abox")); err != nil {
			t.Fatalf("export of an overlay on its base: %v", err)
		}
	})
}

// assertNothingLeft checks that a failed import of name left no instance
// directory, staging directory, libvirt object or cached bundle.
func assertNothingLeft(t *testing.T, r *rig, name string) {
	t.Helper()
	ents, _ := os.ReadDir(r.m.Layout.Instances())
	for _, e := range ents {
		if e.Name() != "dev" {
			t.Errorf("a failed import left %s in the instances directory", e.Name())
		}
	}
	if _, err := r.hv.State(context.Background(), libvirt.DomainName(name)); err == nil {
		t.Errorf("a failed import left the domain of %s", name)
	}
	if r.hv.networks[libvirt.NetworkName(name)] || r.hv.filters[libvirt.FilterName(name)] {
		t.Errorf("a failed import left libvirt objects of %s", name)
	}
}

// plainArchive exports a default instance (nothing that needs trust).
func plainArchive(t *testing.T, r *rig) string {
	t.Helper()
	if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg", DiskGiB: 1}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dev.abox")
	if _, err := r.m.Export(context.Background(), "dev", out); err != nil {
		t.Fatal(err)
	}
	return out
}

// rewrap rewrites the archive at src with its state and entries changed
// by edit (which may rename, replace or drop entries), as an attacker
// would, and returns the new file.
func rewrap(t *testing.T, src string, editState func(map[string]any), edit func(name string, body []byte) (string, []byte)) string {
	t.Helper()
	rd, m := reopen(t, src, editState)
	var names []string
	var bodies [][]byte
	m.Files = nil
	for {
		f, er, err := rd.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(er)
		name := f.Name
		if edit != nil {
			name, b = edit(name, b)
		}
		if name == "" {
			continue
		}
		names, bodies = append(names, name), append(bodies, b)
		m.Files = append(m.Files, archive.File{Name: name, Size: int64(len(b))})
	}
	out := filepath.Join(t.TempDir(), "evil.abox")
	w, err := archive.Create(out, m)
	if err != nil {
		t.Fatal(err)
	}
	for i := range names {
		if err := w.Add(names[i], bytes.NewReader(bodies[i])); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImportRefusesHostileContent(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	good := plainArchive(t, r)
	// A default instance's archive needs no trust.
	if _, _, err := r.m.Import(ctx, good, ImportOptions{Name: "plain"}); err != nil {
		t.Fatalf("import of a default instance's archive: %v", err)
	}
	if err := r.m.Remove(ctx, "plain", false); err != nil {
		t.Fatal(err)
	}

	d := t.TempDir()
	hostFile := filepath.Join(d, "host-secret")
	os.WriteFile(hostFile, []byte("secret"), 0o600)
	img := func(args ...string) []byte {
		p := filepath.Join(d, fmt.Sprintf("img-%d", len(args)))
		os.Remove(p)
		qemu(t, "qemu-img", append([]string{"create", "-q"}, append(args[:len(args)-1], p, args[len(args)-1])...)...)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Backing and data files that are FIFOs: an import that opened them
	// would hang (and then fail with another message).
	fifoBacking, fifoData := filepath.Join(d, "fifo-backing"), filepath.Join(d, "fifo-data")
	os.WriteFile(fifoBacking, nil, 0o600)
	backed := img("-f", "qcow2", "-F", "raw", "-b", fifoBacking, "1M")
	withData := img("-f", "qcow2", "-o", "data_file="+fifoData, "1M")
	for _, p := range []string{fifoBacking, fifoData} {
		os.Remove(p)
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disk := func(name string, body []byte) func(string, []byte) (string, []byte) {
		return func(n string, b []byte) (string, []byte) {
			if archive.IsDisk(n) {
				return name, body
			}
			return n, b
		}
	}
	setState := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	cases := []struct {
		name      string
		editState func(map[string]any)
		edit      func(string, []byte) (string, []byte)
		want      string
	}{
		{"backing file on the host", nil, disk(archive.DiskQCOW2, img("-f", "qcow2", "-F", "raw", "-b", hostFile, "1M")), "backing file"},
		{"backing file that is a FIFO", nil, disk(archive.DiskQCOW2, backed), "backing file"},
		{"external data file that is a FIFO", nil, disk(archive.DiskQCOW2, withData), "external data file"},
		{"external data file", nil, disk(archive.DiskQCOW2, img("-f", "qcow2", "-o", "data_file="+filepath.Join(d, "data"), "1M")), "external data file"},
		{"raw that probes as qcow2", nil, disk(archive.DiskRaw, img("-f", "qcow2", "1M")), `a "qcow2" image, want plain raw`},
		{"internal snapshot", nil, disk(archive.DiskQCOW2, func() []byte {
			p := filepath.Join(d, "snap.qcow2")
			qemu(t, "qemu-img", "create", "-q", "-f", "qcow2", p, "1M")
			qemu(t, "qemu-img", "snapshot", "-c", "s1", p)
			b, _ := os.ReadFile(p)
			return b
		}()), "internal snapshot"},
		{"another format", nil, disk(archive.DiskQCOW2, img("-f", "vmdk", "1M")), "not a plain qcow2 image"},
		{"disk larger than the state says", nil, disk(archive.DiskQCOW2, img("-f", "qcow2", "2G")), "not within the state's 1 GiB"},
		{"unknown state field", setState("evil", true), nil, "unknown field"},
		{"other proxy port", setState("proxy_port", 22), nil, "proxy port 22"},
		{"root user", setState("user", "root"), nil, "user \"root\""},
		{"bad accel", setState("accel", "auto"), nil, "accel"},
		{"kernel outside the archive", setState("kernel", "/etc/shadow"), func(n string, b []byte) (string, []byte) {
			if n == archive.Kernel || n == archive.Initrd {
				return "", nil
			}
			return n, b
		}, "archive lacks boot/kernel"},
		{"bad upstream", setState("upstreams", []string{"resolver.example.com;rm"}), nil, "upstream"},
		{"upstream proxy host with a right-to-left override", setState("upstream_proxy", "http://proxy\u202eexample:3128"), nil, "HOST an IP address or a DNS name"},
		{"credentials without proxy", setState("upstream_proxy_credentials", "/etc/shadow"), nil, "credentials without an upstream proxy"},
		{"credentials flag without proxy", nil, nil, "the archive's instance has no upstream proxy"},
		// The ranges create's flags refuse, and the warning they give.
		{"allow_private of every IPv4 address", setState("allow_private", []string{"0.0.0.0/0"}), nil, `allow_private "0.0.0.0/0": a /0 would permit every address`},
		{"allow_private of every IPv6 address", setState("allow_private", []string{"::/0"}), nil, `allow_private "::/0": a /0 would permit every address`},
		{"allow_host of every address", setState("allow_host", []string{"::/0", "0.0.0.0/0"}), nil, `allow_host "0.0.0.0/0": a /0`},
		{"allow_private wider than a site", setState("allow_private", []string{"10.0.0.0/8"}), nil, "allow_private 10.0.0.0/8 is wider than a /16"},
		{"allow_host wider than a site", setState("allow_host", []string{"fd00::/8"}), nil, "allow_host fd00::/8 is wider than a /48"},
		{"missing ssh key", nil, func(n string, b []byte) (string, []byte) {
			if n == archive.SSHKey {
				return "", nil
			}
			return n, b
		}, "lacks ssh/id_ed25519"},
		{"not an ssh key", nil, func(n string, b []byte) (string, []byte) {
			if n == archive.SSHKey {
				return n, []byte("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n")
			}
			return n, b
		}, "ssh key"},
		{"CA key of another CA", nil, func(n string, b []byte) (string, []byte) {
			if n == archive.CAKey {
				other, _ := ca.New(ca.Config{Dir: filepath.Join(d, "other")})
				other.CertPEM()
				k, _ := os.ReadFile(filepath.Join(d, "other", ca.KeyFile))
				return n, k
			}
			return n, b
		}, "does not match"},
		{"bad allowlist", nil, func(n string, b []byte) (string, []byte) {
			if n == archive.Allowlist {
				return n, []byte("*\n")
			}
			return n, b
		}, "allowlist.txt:1"},
		{"widening settings", setState("no_mitm", true), nil, "mitm.enabled"},
		{"the monitor's channel", setState("monitor", true), nil, "monitor.enabled: adds a channel from the guest to a host process"},

		{"terminal escapes in the kernel command line", setState("cmdline", "console=ttyS0 \x1b]0;owned\a"), nil, "kernel command line"},
	}
	before, _ := os.ReadDir(r.m.Layout.AgentCache())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			evil := rewrap(t, good, c.editState, c.edit)
			o := ImportOptions{Name: "dev2"}
			if c.name == "credentials flag without proxy" {
				o.UpstreamProxyCredentials = hostFile
			}
			_, _, err := r.m.Import(ctx, evil, o)
			if err == nil {
				// Not to fail the cases after this one on the name.
				r.m.Remove(ctx, "dev2", true)
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("import = %v, want a refusal containing %q", err, c.want)
			}
			assertNothingLeft(t, r, "dev2")
		})
	}
	after, _ := os.ReadDir(r.m.Layout.AgentCache())
	if !slices.EqualFunc(before, after, func(a, b fs.DirEntry) bool { return a.Name() == b.Name() }) {
		t.Errorf("failed imports changed the agent cache: %v -> %v", before, after)
	}
	if _, err := os.ReadFile(hostFile); err != nil {
		t.Fatal(err)
	}
}

// TestImportSweepsKilledImports: a staging directory whose import died
// (its lock free) goes at the next import; a running import's stays.
func TestImportSweepsKilledImports(t *testing.T) {
	r := archiveRig(t)
	good := plainArchive(t, r)
	old := time.Now().Add(-time.Hour)
	mk := func(name string) string {
		dir := filepath.Join(r.m.Layout.Instances(), name)
		os.MkdirAll(dir, 0o700)
		os.WriteFile(filepath.Join(dir, ".lock"), nil, 0o600)
		os.Chtimes(dir, old, old)
		return dir
	}
	dead, alive := mk(stagingPrefix+"dead"), mk(stagingPrefix+"alive")
	unlock, err := lockFile(filepath.Join(alive, ".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if _, _, err := r.m.Import(context.Background(), good, ImportOptions{Name: "dev2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); err == nil {
		t.Error("a killed import's staging directory was left")
	}
	if _, err := os.Stat(alive); err != nil {
		t.Errorf("a running import's staging directory was removed: %v", err)
	}
}

// TestImportRefusesABadUpstreamCA: the proxy would trust what the archive's
// upstream-ca.pem holds; it must be certificates, as create requires.
func TestImportRefusesABadUpstreamCA(t *testing.T) {
	r := archiveRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, fullSpec(t)); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dev.abox")
	if _, err := r.m.Export(ctx, "dev", out); err != nil {
		t.Fatal(err)
	}
	evil := rewrap(t, out, nil, func(n string, b []byte) (string, []byte) {
		if n == archive.UpstreamCA {
			return n, []byte("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
		}
		return n, b
	})
	if _, _, err := r.m.Import(ctx, evil, ImportOptions{Name: "dev2", Trust: true, UpstreamProxyCredentials: hostCredentials(t)}); err == nil || !strings.Contains(err.Error(), "holds no PEM certificate") {
		t.Fatalf("import = %v", err)
	}
	assertNothingLeft(t, r, "dev2")
}

// cancelOn cancels when a progress line contains what.
type cancelOn struct {
	what   string
	cancel context.CancelFunc
}

func (c cancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.what) {
		c.cancel()
	}
	return len(p), nil
}

// TestInterruptedExportAndImportLeaveNothing: Ctrl-C (a cancelled context)
// while the disk is being written leaves no file next to the destination,
// and no instance.
func TestInterruptedExportAndImportLeaveNothing(t *testing.T) {
	r := archiveRig(t)
	good := plainArchive(t, r)
	dir := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	r.m.Progress = cancelOn{"exporting dev: disk", cancel}
	if _, err := r.m.Export(ctx, "dev", filepath.Join(dir, "dev.abox")); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted export = %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("an interrupted export left %v", ents)
	}
	ctx, cancel = context.WithCancel(context.Background())
	r.m.Progress = cancelOn{"importing dev2: disk", cancel}
	if _, _, err := r.m.Import(ctx, good, ImportOptions{Name: "dev2"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted import = %v", err)
	}
	assertNothingLeft(t, r, "dev2")
}

// reopen reads the archive at src and returns its reader and manifest,
// the manifest's state changed by editState (nil: unchanged). The file
// is closed when the test ends.
func reopen(t *testing.T, src string, editState func(map[string]any)) (*archive.Reader, archive.Manifest) {
	t.Helper()
	fh, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fh.Close() })
	rd, err := archive.NewReader(fh)
	if err != nil {
		t.Fatal(err)
	}
	m := rd.Manifest()
	var st map[string]any
	json.Unmarshal(m.State, &st)
	if editState != nil {
		editState(st)
	}
	m.State, _ = json.Marshal(st)
	return rd, m
}
