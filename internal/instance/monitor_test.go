package instance

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/tetragon"
	"github.com/abox-dev/abox/internal/tetragon/tetragontest"
)

// writeBundle writes tetragontest.Tarball(files) to a file in dir.
func writeBundle(t *testing.T, dir string, files map[string]string) string {
	t.Helper()
	p := filepath.Join(dir, "bundle.tar.gz")
	if err := os.WriteFile(p, tetragontest.Tarball(files), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCreateWithMonitorBundle: a good bundle is checked into the agent
// cache and recorded with its digest, and turns the monitor on; a hostile
// one is refused before anything of the instance exists.
func TestCreateWithMonitorBundle(t *testing.T) {
	r := newRig(t)
	good := writeBundle(t, t.TempDir(), tetragontest.Agent)
	st, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg", MonitorBundle: good})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(good)
	sum := sha256.Sum256(b)
	if !st.Monitor || st.MonitorBundle == nil || st.MonitorBundle.SHA256 != hex.EncodeToString(sum[:]) || st.MonitorBundle.Source != good {
		t.Fatalf("state %+v, bundle %+v", st, st.MonitorBundle)
	}
	cached, err := os.ReadFile(st.MonitorBundle.Path)
	if err != nil || !bytes.Equal(cached, b) || filepath.Dir(st.MonitorBundle.Path) != r.m.Layout.AgentCache() {
		t.Errorf("cached copy %s: %v", st.MonitorBundle.Path, err)
	}
	if loaded, _ := Load(r.m.Layout, "dev"); loaded.MonitorBundle == nil || *loaded.MonitorBundle != *st.MonitorBundle {
		t.Errorf("saved state lost the bundle: %+v", loaded.MonitorBundle)
	}

	for name, files := range map[string]map[string]string{
		"escaping link": {"usr/local/bin/tetragon": "\x7fELF", "usr/local/lib/tetragon/bpf/x.o": "o", "usr/local/lib/evil": "->/etc"},
		"no agent":      {"usr/local/lib/tetragon/bpf/x.o": "o"},
	} {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			bad := writeBundle(t, t.TempDir(), files)
			_, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg", MonitorBundle: bad})
			var be *tetragon.BundleError
			if !errors.As(err, &be) || !strings.Contains(err.Error(), bad) {
				t.Fatalf("hostile bundle: %v", err)
			}
			if _, err := os.Stat(r.m.Layout.Instance("dev").Dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("instance directory left behind: %v", err)
			}
			if es, _ := os.ReadDir(r.m.Layout.AgentCache()); len(es) != 0 {
				t.Errorf("the refused bundle left %d files in the agent cache", len(es))
			}
			if calls := r.hv.callList(); len(calls) != 0 {
				t.Errorf("libvirt touched: %v", calls)
			}
		})
	}
}

// domainRecorder keeps the domain XML each define was given.
type domainRecorder struct {
	*fakeHV
	defined []string
}

func (d *domainRecorder) DefineDomain(ctx context.Context, xml string) error {
	d.defined = append(d.defined, xml)
	return d.fakeHV.DefineDomain(ctx, xml)
}

// TestCreateMonitorWithTemplate: a user template gets the monitor's
// channel too.
func TestCreateMonitorWithTemplate(t *testing.T) {
	r := newRig(t)
	rec := &domainRecorder{fakeHV: r.hv}
	r.m.Hypervisor = rec
	tmpl := filepath.Join(t.TempDir(), "domain.xml")
	os.WriteFile(tmpl, []byte(`<domain type='{{.DomainType}}'><name>{{.DomainName}}</name><uuid>{{.UUID}}</uuid><memory unit='MiB'>{{.MemoryMiB}}</memory><vcpu>{{.CPUs}}</vcpu><os><type arch='x86_64'>hvm</type></os>
<devices><disk type='file' device='disk'><source file='{{.DiskPath}}'/><target dev='vda' bus='virtio'/></disk>
<interface type='network'><mac address='{{.MAC}}'/><source network='{{.NetworkName}}'/><filterref filter='{{.FilterName}}'/></interface></devices></domain>`), 0o644)
	if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg", Template: tmpl, Monitor: true}); err != nil {
		t.Fatal(err)
	}
	if len(rec.defined) != 1 || !strings.Contains(rec.defined[0], `name="`+libvirt.MonitorChannel+`"`) || !strings.Contains(rec.defined[0], r.m.Layout.Instance("dev").MonitorSocket) {
		t.Fatalf("template domain without the monitor channel:\n%v", rec.defined)
	}
}
