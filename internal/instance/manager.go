package instance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/steps"
	"libvirt.org/go/libvirtxml"
)

// Hypervisor is the part of the libvirt client the orchestrator uses.
type Hypervisor interface {
	DefineNetwork(ctx context.Context, xml string) error
	StartNetwork(ctx context.Context, name string) error
	DestroyNetwork(ctx context.Context, name string) error
	UndefineNetwork(ctx context.Context, name string) error
	ListNetworks(ctx context.Context) ([]libvirt.NetworkInfo, error)
	DefineNWFilter(ctx context.Context, xml string) error
	UndefineNWFilter(ctx context.Context, name string) error
	DefineDomain(ctx context.Context, xml string) error
	StartDomain(ctx context.Context, name string) error
	ShutdownDomain(ctx context.Context, name string) error
	WaitShutoff(ctx context.Context, name string, interval time.Duration) error
	DestroyDomain(ctx context.Context, name string) error
	SetLinkDown(ctx context.Context, domain, network, filter, mac string) error
	UndefineDomain(ctx context.Context, name string) error
	State(ctx context.Context, name string) (libvirt.DomainState, error)
	// Domain is the domain's definition as it runs (see libvirt.Client.Domain).
	Domain(ctx context.Context, name string) (*libvirtxml.Domain, error)

	CreateSnapshot(ctx context.Context, domain, name, description string) (libvirt.Snapshot, error)
	Snapshots(ctx context.Context, domain string) ([]libvirt.Snapshot, error)
	// RevertSnapshot runs check on the definitions a memory snapshot
	// brings back before the guest runs (see libvirt.Client.RevertSnapshot).
	RevertSnapshot(ctx context.Context, domain, name string, check func(domainXML string) error) error
	DeleteSnapshot(ctx context.Context, domain, name string) error
}

// Firewall owns the per-bridge host firewall chains (FORWARD default-deny,
// and what the host and the guest may send each other).
type Firewall interface {
	Ensure(ctx context.Context, b hostfw.Bridge) error
	// EnsurePort makes the guest's tap inert outside its bridge (see
	// hostfw.Port); start runs it as soon as the tap exists.
	EnsurePort(ctx context.Context, p hostfw.Port) error
	Remove(ctx context.Context, bridge string) error
}

// FirewallBridge is what the host firewall of st's bridge depends on: the
// guest, from its own address only, may reach the gateway's DNS filter,
// proxy and capture ports and nothing else on the host. Every caller of hostfw (start, the
// guard, the libvirt hook, doctor) takes it from here.
func FirewallBridge(st State) hostfw.Bridge {
	return hostfw.Bridge{Name: st.Bridge, Gateway: st.Gateway, ProxyPort: st.ProxyPort, Guest: st.GuestIP,
		CaptureHTTPPort: CaptureHTTPPort, CaptureTLSPort: CaptureTLSPort}
}

// Runner runs host programs (qemu-img, genisoimage, ip).
type Runner interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// Images is the part of the image store the orchestrator uses.
type Images interface {
	Get(name string) (image.Image, error)
}

// Manager composes everything an instance's life needs. All fields are
// required unless marked optional.
type Manager struct {
	Layout paths.Layout
	// Hypervisor is opened lazily by the caller; nil operations that need it fail.
	Hypervisor Hypervisor
	Firewall   Firewall
	Images     Images
	Run        Runner
	Daemon     DaemonControl
	// Monitor runs monitored instances' host-side monitor; nil disables it.
	Monitor MonitorControl
	Seeds   SeedWriter
	Log     *slog.Logger
	// Progress receives human progress lines (stderr); optional.
	Progress io.Writer
	// Pool is the address pool instance /24s are taken from.
	Pool string
	// DialGuest opens TCP connections to guests (WaitReady's SSH port
	// check); nil means a plain net.Dialer.
	DialGuest func(ctx context.Context, network, addr string) (net.Conn, error)
	// Access resumes an instance's port forwards after start and releases
	// forwards and mounts before stop and remove; optional.
	Access Access
	// Hook, when set, is the libvirt hook every start installs and then
	// requires to have run (see hook.go); nil leaves hooks alone (tests
	// without a libvirtd).
	Hook *HookConfig
	// OnStep receives the progress of create, import and revert step by
	// step (see internal/steps), each Done event with its duration;
	// optional.
	OnStep func(steps.Event)

	// faultBefore, when set, runs before each step of an operation and
	// fails it with its error (tests: a failure at every step).
	faultBefore func(step string) error
}

// Access is what start, stop and remove do to the host-side ends of an
// instance's guest access (port forwards, sshfs mounts).
type Access interface {
	Resume(ctx context.Context, name string) error
	Release(ctx context.Context, name string) error
}

// HookConfig says where the libvirt hook goes and what it runs.
type HookConfig struct {
	Dir string // the libvirt hooks directory (HooksDir())
	Exe string // the abox binary the hook runs
}

func (m *Manager) progress(format string, args ...any) {
	if m.Progress != nil {
		fmt.Fprintf(m.Progress, format+"\n", args...)
	}
}

// hostHasWorkingKVM decides "auto": /dev/kvm must be usable, and the host
// must not be a PVM-style nested guest, where KVM is advertised but a stock
// kernel hangs right after the decompressor (LAB.md).
func hostHasWorkingKVM() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return false
	}
	return true
}
