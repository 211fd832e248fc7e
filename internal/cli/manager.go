package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/termtext"
)

// EnvLibvirtSocket overrides libvirtd's socket (tests run a private libvirtd).
const EnvLibvirtSocket = "ABOX_LIBVIRT_SOCKET"

// EnvPool overrides the address pool instance subnets come from.
const EnvPool = "ABOX_SUBNET_POOL"

const defaultLibvirtSocket = "/var/run/libvirt/libvirt-sock"

func libvirtSocket() string {
	if s := os.Getenv(EnvLibvirtSocket); s != "" {
		return s
	}
	return defaultLibvirtSocket
}

// manager wires the instance orchestrator to the real hypervisor, firewall,
// image store and processes. The returned function releases the libvirt
// connection.
func (e *env) manager(ctx context.Context) (*instance.Manager, func(), error) {
	l, err := e.layout()
	if err != nil {
		return nil, nil, err
	}
	sock := libvirtSocket()
	hv, err := libvirt.Dial(ctx, sock)
	if err != nil {
		return nil, nil, withHint(err,
			"start libvirtd (`libvirtd -d` with virtlogd, or `make deps` to install it) and run abox as root")
	}
	exe, err := executable()
	if err != nil {
		hv.Close()
		return nil, nil, err
	}
	m := &instance.Manager{
		Layout:     l,
		Hypervisor: hv,
		Firewall:   hostfw.New(hostfw.ExecRunner{}),
		Images:     image.NewStore(l.Root, image.ExecRunner{}, nil),
		Run:        libvirt.ExecRunner{},
		Daemon:     &instance.ProcessDaemon{Layout: l, Exe: exe},
		Monitor:    &instance.MonitorProcess{Layout: l, Exe: exe},
		Seeds:      seedWriter{},
		Progress:   e.stderr,
		Pool:       os.Getenv(EnvPool),
		Access:     guest.Access{Layout: l, Exe: exe, Progress: e.stderr},
		Hook:       &instance.HookConfig{Dir: instance.HooksDir(), Exe: exe},
	}
	if os.Getenv(EnvSteps) != "" {
		m.OnStep = stepPrinter(termtext.NewWriter(e.stderr))
	}
	return m, func() { hv.Close() }, nil
}

// seedWriter renders the cloud-init documents and packs them into the ISO.
type seedWriter struct{}

func (seedWriter) WriteSeed(ctx context.Context, path string, in instance.SeedInput) error {
	s, err := cloudinit.Render(in.CloudInit())
	if err != nil {
		return err
	}
	return cloudinit.WriteISO(ctx, cloudinit.ExecRunner{}, s, path)
}

// readManager is manager for read-only commands: when libvirtd cannot be
// reached they still show what abox knows, with the live status "unknown".
func (e *env) readManager(ctx context.Context) (*instance.Manager, func(), error) {
	m, closeFn, err := e.manager(ctx)
	if err == nil {
		return m, closeFn, nil
	}
	l, lerr := e.layout()
	if lerr != nil {
		return nil, nil, lerr
	}
	exe, xerr := executable()
	if xerr != nil {
		return nil, nil, xerr
	}
	fmt.Fprintf(e.stderr, "warning: %v; live status unknown\n", err)
	return &instance.Manager{Layout: l, Daemon: &instance.ProcessDaemon{Layout: l, Exe: exe}}, func() {}, nil
}

// osExecutable is os.Executable (tests stand in another binary).
var osExecutable = os.Executable

// executable is abox's own binary, checked before abox runs it again: the
// libvirt hook runs it as root from libvirtd, the filter and monitor
// supervisors and the detached helpers as this user, every time. A binary
// that another user could change or swap (owned by them, writable by its
// group or others, in such a directory) would be their way to run code as
// root.
func executable() (string, error) {
	exe, err := osExecutable()
	if err != nil {
		return "", err
	}
	if err := fsutil.CheckExecutable(exe, os.Geteuid()); err != nil {
		return "", withHint(fmt.Errorf("abox runs itself again from %s (the libvirt hook as root, the filter and monitor supervisors), and %w: whoever can change it would run code as this user", exe, err),
			"install it owned by root and writable by root alone, such as `install -o root -g root -m 0755 bin/abox /usr/local/bin/abox`, and run that one")
	}
	return exe, nil
}
