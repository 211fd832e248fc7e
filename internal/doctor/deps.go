package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Host is what check-deps looks at; every field has a real default
// (DefaultHost) and tests replace them.
type Host struct {
	LookPath func(file string) (string, error)
	ReadFile func(path string) ([]byte, error)
	Stat     func(path string) (fs.FileInfo, error)
	// OpenKVM opens /dev/kvm read-write and closes it.
	OpenKVM func() error
	// Run runs a program and returns its combined output.
	Run func(ctx context.Context, name string, args ...string) ([]byte, error)
	// DialLibvirt connects to libvirtd and disconnects.
	DialLibvirt func(ctx context.Context) error
	// FreeBytes is the space available to abox below path.
	FreeBytes func(path string) (uint64, error)
	// Home is abox's data root.
	Home string
}

// DefaultHost looks at this machine.
func DefaultHost(home string, dialLibvirt func(ctx context.Context) error) Host {
	return Host{
		LookPath: exec.LookPath,
		ReadFile: os.ReadFile,
		Stat:     os.Stat,
		OpenKVM: func() error {
			f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
			if err != nil {
				return err
			}
			return f.Close()
		},
		Run: func(ctx context.Context, name string, args ...string) ([]byte, error) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return exec.CommandContext(ctx, name, args...).CombinedOutput()
		},
		DialLibvirt: dialLibvirt,
		FreeBytes: func(path string) (uint64, error) {
			var s syscall.Statfs_t
			if err := syscall.Statfs(path, &s); err != nil {
				return 0, err
			}
			return s.Bavail * uint64(s.Bsize), nil
		},
		Home: home,
	}
}

// minFreeBytes is room for a base image and a few overlays.
const minFreeBytes = 5 << 30

// tool is a program abox runs.
type tool struct {
	bin, pkg, why string
	// optional tools warn instead of failing.
	optional bool
}

var tools = []tool{
	{bin: "qemu-system-x86_64", pkg: "qemu-system-x86", why: "runs the guests"},
	{bin: "qemu-img", pkg: "qemu-utils", why: "disk overlays and image import"},
	{bin: "genisoimage", pkg: "genisoimage", why: "the cloud-init seed of every instance"},
	{bin: "iptables", pkg: "iptables", why: "the host chains of every bridge"},
	{bin: "ip6tables", pkg: "iptables", why: "the host chains of every bridge (IPv6)"},
	{bin: "iptables-restore", pkg: "iptables", why: "changes the host chains in one transaction"},
	{bin: "ip6tables-restore", pkg: "iptables", why: "changes the host chains in one transaction (IPv6)"},
	{bin: "nft", pkg: "nftables", why: "the table of every bridge that answers refused flows at once"},
	{bin: "ebtables", pkg: "ebtables", why: "libvirt's nwfilter programs layer-2 rules with it"},
	{bin: "ssh", pkg: "openssh-client", why: "abox ssh and doctor's probes in the guest"},
	{bin: "tcpdump", pkg: "tcpdump", why: "abox tap"},
	{bin: "tshark", pkg: "tshark", why: "decrypting tap captures with the TLS key log", optional: true},
	{bin: "debootstrap", pkg: "debootstrap", why: "abox base build (offline image build)", optional: true},
	{bin: "mke2fs", pkg: "e2fsprogs", why: "abox base build", optional: true},
}

// CheckDeps checks every host tool and kernel feature abox needs, each with
// the command that fixes it.
func CheckDeps(ctx context.Context, h Host) Report {
	t0 := time.Now()
	var r Report
	r.add(checkLibvirtd(ctx, h))
	for _, t := range tools {
		r.add(checkTool(h, t))
	}
	r.add(checkBackend(ctx, h, "iptables"))
	r.add(checkBackend(ctx, h, "ebtables"))
	r.add(checkKVM(h))
	r.add(checkBridgeNetfilter(h))
	r.add(checkDisk(h))
	r.TookMS = since(t0)
	return r
}

func checkLibvirtd(ctx context.Context, h Host) Check {
	c := Check{Layer: "host", Name: "libvirtd reachable"}
	if h.DialLibvirt == nil {
		c.Status, c.Detail = Skip, "no libvirt connection configured"
		return c
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := h.DialLibvirt(ctx); err != nil {
		c.Status, c.Detail = Fail, err.Error()
		c.Fix = "apt-get install libvirt-daemon-system && virtlogd -d && libvirtd -d (or systemctl start libvirtd); run abox as root"
		return c
	}
	c.Status = Pass
	return c
}

func checkTool(h Host, t tool) Check {
	c := Check{Layer: "host", Name: t.bin}
	p, err := h.LookPath(t.bin)
	if err != nil {
		c.Status, c.Detail = Fail, "not installed ("+t.why+")"
		if t.optional {
			c.Status = Warn
		}
		c.Fix = "apt-get install " + t.pkg
		return c
	}
	c.Status, c.Detail = Pass, p
	return c
}

// checkBackend names the netfilter backend of iptables or ebtables
// (nf_tables or legacy); either works, a broken one does not.
func checkBackend(ctx context.Context, h Host, bin string) Check {
	c := Check{Layer: "host", Name: bin + " backend"}
	if _, err := h.LookPath(bin); err != nil {
		c.Status, c.Detail = Skip, bin+" not installed"
		return c
	}
	out, err := h.Run(ctx, bin, "-L", "-n")
	if bin == "ebtables" {
		out, err = h.Run(ctx, bin, "-L")
	}
	if err != nil {
		c.Status, c.Detail = Fail, fmt.Sprintf("%s cannot list rules: %v: %s", bin, err, strings.TrimSpace(string(out)))
		c.Fix = "run as root; load the netfilter modules (modprobe nf_tables, or ip_tables/ebtables for legacy) or pick a working backend with update-alternatives --config " + bin
		return c
	}
	v, _ := h.Run(ctx, bin, "--version")
	c.Status, c.Detail = Pass, strings.TrimSpace(string(v))
	return c
}

func checkKVM(h Host) Check {
	c := Check{Layer: "host", Name: "kvm"}
	if err := h.OpenKVM(); err != nil {
		c.Status = Warn
		c.Detail = "not usable (" + err.Error() + "): guests run under TCG, several times slower"
		if errors.Is(err, fs.ErrNotExist) {
			c.Fix = "enable virtualisation (VT-x/AMD-V) in the firmware and modprobe kvm_intel or kvm_amd; or keep --accel tcg"
		} else {
			c.Fix = "run abox as root or add the user to the kvm group; or keep --accel tcg"
		}
		return c
	}
	if _, err := h.Stat("/sys/module/kvm_pvm"); err == nil {
		c.Status = Warn
		c.Detail = "/dev/kvm is a PVM nested hypervisor that hangs stock kernels: --accel auto uses TCG"
		c.Fix = "nothing to do on this host (use --accel tcg or auto); bare-metal hosts get KVM"
		return c
	}
	c.Status, c.Detail = Pass, "/dev/kvm usable: --accel auto uses KVM"
	return c
}

func checkBridgeNetfilter(h Host) Check {
	c := Check{Layer: "host", Name: "bridge netfilter"}
	fix := "modprobe br_netfilter && sysctl -w net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1"
	var off []string
	for _, sw := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		b, err := h.ReadFile(filepath.Join("/proc/sys/net/bridge", sw))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// abox start loads the module itself.
			c.Status, c.Detail = Warn, "br_netfilter not loaded (abox start loads it)"
			c.Fix = fix
			return c
		case err != nil:
			off = append(off, sw+": "+err.Error())
		case strings.TrimSpace(string(b)) != "1":
			off = append(off, "net.bridge."+sw+" = "+strings.TrimSpace(string(b)))
		}
	}
	if len(off) > 0 {
		c.Status, c.Fix = Fail, fix
		c.Detail = strings.Join(off, ", ") + ": the nwfilter's IP rules would see no guest traffic, abox start refuses"
		return c
	}
	c.Status, c.Detail = Pass, "bridged traffic reaches iptables"
	return c
}

func checkDisk(h Host) Check {
	c := Check{Layer: "host", Name: "disk space"}
	dir := h.Home
	// The data root may not exist yet: measure the nearest parent.
	for dir != "/" && dir != "." {
		if _, err := h.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	free, err := h.FreeBytes(dir)
	if err != nil {
		c.Status, c.Detail = Warn, "cannot measure free space at "+dir+": "+err.Error()
		return c
	}
	c.Detail = fmt.Sprintf("%.1f GiB free at %s", float64(free)/(1<<30), dir)
	if free < minFreeBytes {
		c.Status = Warn
		c.Fix = fmt.Sprintf("free space below %s or set ABOX_HOME to a larger filesystem (a base image and its overlays need about 5 GiB)", dir)
		return c
	}
	c.Status = Pass
	return c
}
