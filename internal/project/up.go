package project

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/tetragon"
)

// UpOptions tune Up.
type UpOptions struct {
	// Provision runs the provisioning again on an instance already
	// provisioned.
	Provision bool
}

// Drift is a setting where the file and the instance disagree and that
// only a re-create changes.
type Drift struct {
	Key      string `json:"key"`
	File     string `json:"file"`
	Instance string `json:"instance"`
}

// Blocked is a request the filters refused while provisioning, with what
// would have allowed it.
type Blocked struct {
	Component string `json:"component"` // dns or http
	Target    string `json:"target"`
	Reason    string `json:"reason"`
	// Fix is the abox.yaml change that would allow it, or empty when no
	// setting should (an address class the filters always refuse).
	Fix string `json:"fix,omitempty"`
}

// Report is what Up did.
type Report struct {
	Name        string    `json:"name"`
	Created     bool      `json:"created"`
	Provisioned bool      `json:"provisioned"`
	Drift       []Drift   `json:"drift,omitempty"`
	Applied     []string  `json:"applied,omitempty"`
	Blocked     []Blocked `json:"blocked,omitempty"`
}

// Up brings the instance p describes up: trust, create if missing, start,
// wait for SSH and cloud-init, allowlist and mode, provisioning on the
// first boot (in active mode), forwards. On an existing instance it reports
// drift and applies what can change live.
func Up(ctx context.Context, d Deps, p *config.Project, o UpOptions) (Report, error) {
	rep := Report{Name: p.Name}
	if err := d.Trust.Check(p); err != nil {
		return rep, err
	}
	store := secrets.Open(d.Layout.Secrets())
	if err := checkSecretsStored(store, p); err != nil {
		return rep, err
	}
	allow := p.MergedAllowlist()
	name := p.Name
	st, err := instance.Load(d.Layout, name)
	switch {
	case errors.Is(err, instance.ErrNotFound):
		// Bound before the instance is made, so that its seed carries
		// the placeholders and the guest has them from the first boot.
		prior, err := bindingsOf(store, name)
		if err != nil {
			return rep, err
		}
		applied, bound, _, err := applySecrets(store, p, nil)
		if err == nil {
			st, err = create(ctx, d, p, allow, bound)
		}
		if err != nil {
			// Only what this up bound: a binding made by hand before,
			// or by another up of the name, stays.
			return rep, errors.Join(err, unbindNew(store, name, prior))
		}
		rep.Created = true
		rep.Applied = append(rep.Applied, applied...)
	case err != nil:
		return rep, err
	default:
		bd, ok, err := loadBinding(d.Layout, name)
		if err != nil {
			return rep, err
		}
		if !ok || bd.File != p.Path {
			made := "with `abox create`"
			if ok {
				made = "from " + bd.File
			}
			return rep, fmt.Errorf("up %s: an instance %s exists, made %s: %w (change name: in %s, or remove the instance)", p.Path, name, made, ErrNotThisProject, p.Path)
		}
		if rep.Drift, err = drift(p, st); err != nil {
			return rep, err
		}
		for _, dr := range rep.Drift {
			d.progress("drift: %s: the file says %s, instance %s has %s (needs a re-create: abox down --rm && abox up)", dr.Key, dr.File, name, dr.Instance)
		}
		applied, bound, fresh, err := applySecrets(store, p, bd.Secrets)
		rep.Applied = append(rep.Applied, applied...)
		if !slices.Equal(bound, bd.Secrets) {
			bd.Secrets = bound
			if serr := saveBinding(d.Layout, name, bd); serr != nil {
				return rep, errors.Join(err, serr)
			}
		}
		if err != nil {
			return rep, err
		}
		for _, s := range fresh {
			d.progress("up %s: %s is newly bound; the guest was made before, so its environment lacks the placeholder: `abox secret env -i %s` prints it (docs/secrets.md)", name, s, name)
		}
	}
	info, err := d.Manager.Describe(ctx, name)
	if err != nil {
		return rep, err
	}
	if info.Status != "running" || info.DaemonPID == 0 {
		if err := d.Manager.Start(ctx, name); err != nil {
			return rep, err
		}
	}
	t := guest.Target{Layout: d.Layout, State: st}
	d.progress("up %s: waiting for SSH and cloud-init", name)
	boot, err := d.Manager.WaitReady(ctx, name, d.BootTimeout)
	if err != nil {
		return rep, err
	}
	d.progress("up %s: guest ready %s after start", name, boot.ReadyAfter().Round(time.Second))
	if err := guest.StartMonitorAgent(ctx, t, d.Progress); err != nil {
		// The monitor never holds the instance back.
		d.progress("warning: %v (abox monitor agent %s retries)", err, name)
	}
	c := d.api(name)
	applied, err := syncAllowlist(ctx, c, allow)
	if err != nil {
		return rep, fmt.Errorf("up %s: allowlist: %w", name, err)
	}
	rep.Applied = append(rep.Applied, applied...)
	bd, _, err := loadBinding(d.Layout, name)
	if err != nil {
		return rep, err
	}
	if (!bd.Provisioned || o.Provision) && (len(p.Scripts) > 0 || p.Overlay != "") {
		blocked, err := provision(ctx, d, p, t)
		rep.Blocked = blocked
		for _, b := range blocked {
			line := fmt.Sprintf("blocked during provisioning: %s %s (%s)", b.Component, b.Target, b.Reason)
			if b.Fix != "" {
				line += "; to allow it add to " + p.Path + ": " + b.Fix
			}
			d.progress("%s", line)
		}
		if err != nil {
			return rep, err
		}
		bd.Provisioned = true
		if err := saveBinding(d.Layout, name, bd); err != nil {
			return rep, err
		}
		rep.Provisioned = true
	}
	want := policy.Active
	if p.Passive {
		want = policy.Passive
	}
	if cur, err := c.Mode(ctx); err != nil {
		return rep, fmt.Errorf("up %s: mode: %w", name, err)
	} else if cur != want {
		if err := c.SetMode(ctx, want); err != nil {
			return rep, fmt.Errorf("up %s: mode: %w", name, err)
		}
		rep.Applied = append(rep.Applied, "mode "+string(want))
	}
	have := map[string]bool{}
	fs, err := d.Access.Forwards(name)
	if err != nil {
		return rep, err
	}
	for _, f := range fs {
		if !f.Reverse {
			have[f.Forward.String()] = true
		}
	}
	for _, cf := range p.Forwards {
		f := guest.Forward{HostPort: cf.HostPort, GuestPort: cf.GuestPort}
		if have[f.String()] {
			continue
		}
		if err := d.Access.AddForward(ctx, t, f, true); err != nil {
			return rep, err
		}
		rep.Applied = append(rep.Applied, "forward "+f.Describe())
	}
	for _, a := range rep.Applied {
		d.progress("up %s: applied %s", name, a)
	}
	return rep, nil
}

// create makes the instance from the file. The files it names are read
// through the project root and handed to Create as private copies, so
// nothing outside the project is read on the file's behalf.
func create(ctx context.Context, d Deps, p *config.Project, allow []string, bound []boundSecret) (instance.State, error) {
	tmp, err := os.MkdirTemp("", "abox-up-")
	if err != nil {
		return instance.State{}, err
	}
	defer os.RemoveAll(tmp)
	spec := instance.Spec{
		Name: p.Name, Base: p.Base, CPUs: p.CPUs, MemoryMiB: p.MemoryMiB, DiskGiB: p.DiskGiB,
		User: instance.DefaultUser, Accel: p.Accel, Upstreams: p.Upstreams, AllowPrivate: p.AllowPrivate,
		NoMITM: p.NoMITM, MITMExceptions: p.MITMExceptions, Ports: p.Ports, Monitor: p.Monitor,
	}
	if p.MonitorBundle == instance.BundleRelease {
		spec.MonitorBundle = instance.BundleRelease
	} else if p.MonitorBundle != "" {
		if spec.MonitorBundle, err = p.CopyFile("monitor.bundle", p.MonitorBundle, tmp, tetragon.MaxCompressed); err != nil {
			return instance.State{}, err
		}
		spec.MonitorBundleSource = filepath.Join(p.Dir, p.MonitorBundle)
	}
	if p.UpstreamProxy != nil {
		spec.UpstreamProxy = p.UpstreamProxy.String()
		if spec.UpstreamProxyCredentials, err = expandHome(p.ProxyCredentials); err != nil {
			return instance.State{}, err
		}
	}
	spec.Allowlist = tmp + "/allowlist.txt"
	if err := os.WriteFile(spec.Allowlist, []byte(strings.Join(allow, "\n")+"\n"), 0o600); err != nil {
		return instance.State{}, err
	}
	copyIn := func(key, rel, dst string) (string, error) {
		if rel == "" {
			return "", nil
		}
		b, err := p.ReadFile(key, rel)
		if err != nil {
			return "", err
		}
		return tmp + "/" + dst, os.WriteFile(tmp+"/"+dst, b, 0o600)
	}
	if spec.UpstreamCA, err = copyIn("upstream_ca", p.UpstreamCA, "upstream-ca.pem"); err != nil {
		return instance.State{}, err
	}
	if spec.Template, err = copyIn("overrides.libvirt.template", p.Template, "domain.xml"); err != nil {
		return instance.State{}, err
	}
	d.progress("up %s: creating the instance from %s", p.Name, p.Path)
	st, warnings, err := d.Manager.Create(ctx, spec)
	for _, w := range warnings {
		d.progress("warning: %s", w)
	}
	if err != nil {
		return instance.State{}, err
	}
	if err := saveBinding(d.Layout, p.Name, binding{File: p.Path, CreatedAt: time.Now().UTC(), Secrets: bound}); err != nil {
		rerr := d.Manager.Remove(context.WithoutCancel(ctx), p.Name, true)
		return instance.State{}, errors.Join(err, rerr)
	}
	return st, nil
}

// drift compares what only a re-create changes.
func drift(p *config.Project, st instance.State) ([]Drift, error) {
	var out []Drift
	differ := func(key, file, inst string) {
		if file != inst {
			out = append(out, Drift{Key: key, File: file, Instance: inst})
		}
	}
	differ("base", p.Base, st.Base)
	differ("cpus", fmt.Sprint(p.CPUs), fmt.Sprint(st.CPUs))
	differ("memory", fmt.Sprint(p.MemoryMiB), fmt.Sprint(st.MemoryMiB))
	differ("disk", fmt.Sprint(p.DiskGiB), fmt.Sprint(st.DiskGiB))
	differ("monitor.enabled", fmt.Sprint(p.Monitor), fmt.Sprint(st.Monitor))
	if p.Accel != "auto" {
		differ("accel", p.Accel, st.Accel)
	}
	ports := func(ps []uint16) string {
		if len(ps) == 0 {
			ps = []uint16{80, 443}
		}
		var s []string
		for _, p := range ps {
			s = append(s, fmt.Sprint(p))
		}
		sort.Strings(s)
		return strings.Join(slices.Compact(s), ",")
	}
	differ("ports", ports(p.Ports), ports(st.Ports))
	set := func(items []string) string {
		s := slices.Clone(items)
		sort.Strings(s)
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(slices.Compact(s), ",")
	}
	var fp, ip []string
	for _, x := range p.AllowPrivate {
		fp = append(fp, x.String())
	}
	for _, x := range st.AllowPrivate {
		ip = append(ip, x.String())
	}
	differ("allow_private", set(fp), set(ip))
	differ("mitm.enabled", fmt.Sprint(!p.NoMITM), fmt.Sprint(!st.NoMITM))
	differ("mitm.exceptions", set(p.MITMExceptions), set(st.MITMExceptions))
	differ("dns.upstreams", set(p.Upstreams), set(st.Upstreams))
	proxy := "none"
	if p.UpstreamProxy != nil {
		proxy = p.UpstreamProxy.String()
	}
	if st.UpstreamProxy != "" || proxy != "none" {
		differ("upstream_proxy.url", proxy, cmp.Or(st.UpstreamProxy, "none"))
	}
	same := func(key, rel string, have []byte) error {
		var want []byte
		if rel != "" {
			b, err := p.ReadFile(key, rel)
			if err != nil {
				return err
			}
			want = b
		}
		if !bytes.Equal(want, have) {
			f, i := "none", "none"
			if rel != "" {
				f = rel
			}
			if len(have) > 0 {
				i = "another content"
			}
			out = append(out, Drift{Key: key, File: f, Instance: i})
		}
		return nil
	}
	var ca []byte
	if st.UpstreamCA != "" {
		b, err := os.ReadFile(st.UpstreamCA)
		if err != nil {
			return nil, err
		}
		ca = b
	}
	if err := same("upstream_ca", p.UpstreamCA, ca); err != nil {
		return nil, err
	}
	if err := same("overrides.libvirt.template", p.Template, []byte(st.Template)); err != nil {
		return nil, err
	}
	return out, nil
}

// expandHome turns a leading ~/ into the user's home: the credentials file
// is the user's, outside the project.
func expandHome(p string) (string, error) {
	rest, ok := strings.CutPrefix(p, "~/")
	if !ok {
		return p, nil
	}
	h, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("upstream_proxy.credentials_file %s: %w", p, err)
	}
	return filepath.Join(h, rest), nil
}
