package image

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// DefaultMirror is the Debian mirror BuildDebian12 uses when given none.
const DefaultMirror = "http://deb.debian.org/debian"

// DefaultCacheDir holds built images outside any work tree, so CI and later
// runs on the same machine pay for a build once.
const DefaultCacheDir = "/var/cache/abox/images"

// BuildFile is the metadata file of a cached build.
const BuildFile = "build.json"

// Recipe is everything that decides a built image's content. Its hash names
// the cache directory; change anything here and the next build starts over.
// The mirror is deliberately not part of it: any Debian mirror serves the
// same packages.
type Recipe struct {
	Version  int               `json:"version"` // bump to invalidate every cached build
	Suite    string            `json:"suite"`
	Variant  string            `json:"variant"`
	Packages []string          `json:"packages"`
	DiskSize string            `json:"disk_size"` // mke2fs size, e.g. "2G"
	Cmdline  string            `json:"cmdline"`
	Files    map[string]string `json:"files"`    // absolute guest path -> content
	Symlinks map[string]string `json:"symlinks"` // absolute guest path -> target
	Enable   []string          `json:"enable"`   // systemd units enabled in the image
	Disable  []string          `json:"disable"`  // systemd units disabled in the image
	Remove   []string          `json:"remove"`   // guest paths deleted (glob patterns)
	Chroot   [][]string        `json:"chroot"`   // commands run in the tree last, in order
}

// Hash is the hex sha256 of the recipe's canonical JSON.
func (r Recipe) Hash() string {
	b, err := json.Marshal(r) // maps marshal with sorted keys
	if err != nil {
		panic(err) // only strings, ints and maps of strings: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Debian12Cmdline boots the built image: serial console for the log file,
// the whole virtio disk is the root file system (no partition table), and
// the NIC keeps the kernel's name eth0, which the seed's network config
// asks for anyway: cloud-init then has no interface to rename, and does not
// wait for udev to settle after a rename in its first stage.
// no_timer_check skips the kernel's early check that the IO-APIC timer
// ticks within a few emulated milliseconds: under TCG on a loaded host
// it can fail, and the guest panics ("IO-APIC + timer doesn't work!")
// before it prints a second line (seen in CI at a load average of 14).
const Debian12Cmdline = "console=ttyS0 root=/dev/vda rw net.ifnames=0 no_timer_check"

// Debian12Recipe is the cloud-init-ready Debian 12 image abox builds offline.
func Debian12Recipe() Recipe {
	return Recipe{
		Version: 8, // 8: git (coding agents clone and push; the suite's code host)
		Suite:   "bookworm",
		Variant: "minbase",
		Packages: []string{
			// LAB.md's list; python3-cffi-backend is a virtual-package
			// dependency of cloud-init that debootstrap does not resolve.
			"systemd-sysv", "openssh-server", "cloud-init", "python3-cffi-backend",
			"iproute2", "curl", "ca-certificates", "linux-image-amd64", "dnsutils",
			// udev: networkd only configures links udev has initialised, and
			// serial-getty waits for the ttyS0 device unit.
			"udev",
			// cloud-init's networkd renderer writes the static address and DNS;
			// resolved applies the nameservers; dbus for hostnamectl/resolvectl.
			"systemd-resolved", "dbus",
			// cloud-init's sudo rule needs sudo; netbase gives /etc/services and
			// /etc/protocols; the rest are the e2e suite's probes.
			"sudo", "netbase", "procps", "iputils-ping", "netcat-openbsd",
			// What a coding agent needs first, and the suite's code host
			// is cloned and pushed to with it.
			"git",
		},
		DiskSize: "2G",
		Cmdline:  Debian12Cmdline,
		Files: map[string]string{
			// debootstrap copies the build host's resolv.conf; resolved's stub
			// replaces it (symlink below). Without an /etc/hosts every sudo
			// waits on the resolver for the hostname.
			"/etc/hosts":    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
			"/etc/hostname": "debian\n",
			"/etc/fstab":    "/dev/vda\t/\text4\terrors=remount-ro\t0\t1\n",
			// An empty machine-id makes systemd generate one per instance.
			"/etc/machine-id": "",
			"/etc/cloud/cloud.cfg.d/90_abox.cfg": `# Written by abox's image build.
datasource_list: [ NoCloud, None ]
# The networkd renderer: no ifupdown or netplan in the image.
system_info:
  network:
    renderers: [ networkd ]
# Host keys are generated per instance on first boot (the build deletes the
# ones the package made); RSA keygen is slow under TCG, so skip it.
ssh_deletekeys: true
ssh_genkeytypes: [ ed25519, ecdsa ]
# No locales package in minbase.
locale: false
manage_etc_hosts: true
# Only the modules abox's seeds use: under TCG each module costs seconds
# (the stock list took about a minute of a first boot). The seed writes its
# files (sshd settings before sshd starts, proxy settings, the instance CA
# into the prepared trust store: no ca-certs module, which rebuilt the
# store and alone took ~29 s), creates the user and installs the keys; the
# root file system grows to the instance's disk size. Nothing is left for
# the config stage, whose service is masked (a Python start costs ~5 s
# under TCG); the final stage still runs, so cloud-init reports done.
cloud_init_modules:
  - write-files
  - resizefs
  - set_hostname
  - update_hostname
  - update_etc_hosts
  - users-groups
  - ssh
cloud_config_modules: []
cloud_final_modules: []
`,
			// abox guests have no IPv6 (the packet filter drops it). With
			// IPv6 on, networkd keeps eth0 "configuring" until its router
			// solicitations time out and network-online waits ~12 s for that;
			// a sysctl does not help, networkd turns IPv6 back on for links it
			// manages. cloud-init's networkd renderer names the file after the
			// interface, so this holds for seeds that name it eth0 (set-name).
			// Guest root can still re-enable IPv6 on purpose.
			"/etc/systemd/network/10-cloud-init-eth0.network.d/90-abox-no-ipv6.conf": "[Network]\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n",
			// The initrd only has to find a virtio disk with ext4 on it. The
			// stock MODULES=most packs every storage and file-system driver
			// (36 MB, unpacked and probed by udev under emulation on every
			// boot); the list below is what a virtio guest needs. ext4 asks
			// the crypto API for crc32c at mount time, which no module
			// dependency names, so it is listed too.
			"/etc/initramfs-tools/conf.d/90-abox.conf": "MODULES=list\n",
			"/etc/initramfs-tools/modules":             "virtio_pci\nvirtio_blk\next4\ncrc32c_generic\n",
			// The seed's system.conf drop-in (the proxy environment for
			// services, cloudinit.UserData) is written by cloud-init after
			// systemd started, so on the first boot the manager is reloaded
			// once to read it; on later boots it reads it when it starts and
			// this does nothing. Before cloud-final: abox start waits for
			// cloud-init to finish, so no session sees services without it.
			"/etc/systemd/system/abox-seed-environment.service": `[Unit]
Description=Give services the environment abox's seed wrote
After=cloud-init.service
Before=cloud-final.service
ConditionPathExists=/etc/systemd/system.conf.d/90-abox-proxy.conf

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'systemctl show-environment | grep -q "^https_proxy=" || systemctl daemon-reload'

[Install]
WantedBy=multi-user.target
`,
			// cloud-final was ordered after the init stage only through
			// cloud-config, which is masked above.
			"/etc/systemd/system/cloud-final.service.d/90-abox.conf": "[Unit]\nAfter=cloud-init.service\n",
			// Keep later installs in the guest small as well.
			"/etc/dpkg/dpkg.cfg.d/01-abox-nodoc": "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\npath-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\npath-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n",
		},
		Symlinks: map[string]string{
			"/etc/resolv.conf": "../run/systemd/resolve/stub-resolv.conf",
			// The config stage has no modules (90_abox.cfg): masked.
			"/etc/systemd/system/cloud-config.service": "/dev/null",
		},
		Enable: []string{"systemd-networkd.service", "systemd-resolved.service", "ssh.service", "abox-seed-environment.service"},
		// Background jobs that only cost CPU in a TCG guest without a mirror.
		Disable: []string{"apt-daily.timer", "apt-daily-upgrade.timer", "e2scrub_all.timer", "e2scrub_reap.service"},
		Remove: []string{
			"/etc/ssh/ssh_host_*",
			"/var/lib/dbus/machine-id",
			"/var/cache/apt/archives/*.deb",
			"/var/cache/apt/*.bin",
			"/var/lib/apt/lists/*_*",
			"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*",
			"/usr/share/locale/*/LC_MESSAGES",
			"/var/log/*.log",
			"/var/lib/cloud",
			// Drivers a virtio guest never loads: about 210 of the 390 MB of
			// modules. Netfilter, file systems, virtio, SCSI and block stay
			// (an agent may run Docker or mount things).
			"/usr/lib/modules/*/kernel/drivers/gpu",
			"/usr/lib/modules/*/kernel/drivers/media",
			"/usr/lib/modules/*/kernel/drivers/net/wireless",
			"/usr/lib/modules/*/kernel/drivers/net/ethernet",
			"/usr/lib/modules/*/kernel/drivers/infiniband",
			"/usr/lib/modules/*/kernel/drivers/usb",
			"/usr/lib/modules/*/kernel/drivers/iio",
			"/usr/lib/modules/*/kernel/drivers/staging",
			"/usr/lib/modules/*/kernel/drivers/bluetooth",
			"/usr/lib/modules/*/kernel/sound",
			"/usr/lib/modules/*/kernel/net/bluetooth",
			"/usr/lib/modules/*/kernel/net/wireless",
			"/usr/lib/modules/*/kernel/net/mac80211",
		},
		Chroot: [][]string{
			// Rebuild modules.dep after the pruning above.
			{"sh", "-c", `for d in /usr/lib/modules/*; do depmod -a "${d##*/}"; done`},
			// And the initrd with the module list above.
			{"update-initramfs", "-u", "-k", "all"},
		},
	}
}

// Built is a cached image build: a qcow2 root file system plus the kernel
// and initrd to boot it directly. Files stay in the cache; Import them into
// a Store (WithDirectBoot) to use them as a base.
type Built struct {
	Dir      string    `json:"-"` // <cacheDir>/<recipe hash>
	Recipe   string    `json:"recipe"`
	Disk     string    `json:"disk"`   // absolute path of the qcow2
	Kernel   string    `json:"kernel"` // absolute path
	Initrd   string    `json:"initrd"` // absolute path
	Cmdline  string    `json:"cmdline"`
	SHA256   string    `json:"sha256"` // of Disk
	Created  time.Time `json:"created"`
	Duration string    `json:"duration"` // how long the build took
	Cached   bool      `json:"-"`        // true when this call found it built
}

// ImportOptions are the options that Import needs to store b as a base.
func (b Built) ImportOptions() []ImportOption {
	return []ImportOption{
		WithDirectBoot(b.Kernel, b.Initrd, b.Cmdline),
		WithSource("build:debian-12:"+b.Recipe, ""),
	}
}

// Builder builds base images from distribution mirrors. It must run as root
// (debootstrap, chroot, device nodes in the tree).
type Builder struct {
	Run Runner
}

// BuildDebian12 builds Debian12Recipe (or returns the cached build) under
// cacheDir/<recipe hash>/. An empty mirror means DefaultMirror, an empty
// cacheDir DefaultCacheDir. The build happens in a temporary directory that
// is renamed into place when complete, so concurrent builds and crashes never
// expose a partial image.
func (b Builder) BuildDebian12(ctx context.Context, mirror, cacheDir string, progress Progress) (Built, error) {
	return b.Build(ctx, Debian12Recipe(), mirror, cacheDir, progress)
}

// LookupBuilt returns the cached build of r in cacheDir, or ErrNotFound.
func LookupBuilt(r Recipe, cacheDir string) (Built, error) {
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	dir := filepath.Join(cacheDir, r.Hash())
	data, err := os.ReadFile(filepath.Join(dir, BuildFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Built{}, fmt.Errorf("looking up build %s: %w", r.Hash(), ErrNotFound)
	}
	if err != nil {
		return Built{}, fmt.Errorf("looking up build %s: %w", r.Hash(), err)
	}
	var bt Built
	if err := json.Unmarshal(data, &bt); err != nil {
		return Built{}, fmt.Errorf("looking up build %s: %w", r.Hash(), err)
	}
	bt.Dir = dir
	// Paths are stored relative so that a cache directory can be moved.
	bt.Disk = filepath.Join(dir, bt.Disk)
	bt.Kernel = filepath.Join(dir, bt.Kernel)
	bt.Initrd = filepath.Join(dir, bt.Initrd)
	for _, p := range []string{bt.Disk, bt.Kernel, bt.Initrd} {
		if _, err := os.Stat(p); err != nil {
			return Built{}, fmt.Errorf("looking up build %s: %w", r.Hash(), err)
		}
	}
	bt.Cached = true
	return bt, nil
}

// Build builds r (see BuildDebian12).
func (b Builder) Build(ctx context.Context, r Recipe, mirror, cacheDir string, progress Progress) (Built, error) {
	if mirror == "" {
		mirror = DefaultMirror
	}
	if cacheDir == "" {
		cacheDir = DefaultCacheDir
	}
	hash := r.Hash()
	if bt, err := LookupBuilt(r, cacheDir); err == nil {
		progress.report("cached", 0, 0)
		return bt, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Built{}, err
	}
	start := time.Now()
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".build-"+hash[:12]+"-")
	if err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			if err := removeTree(tmp); err != nil {
				progress.report("cleanup failed: "+err.Error(), 0, 0)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	root := filepath.Join(tmp, "root")

	progress.report("debootstrap", 0, 0)
	// A private mount namespace: whatever debootstrap mounts inside the tree
	// (proc, sys, devpts) disappears with it, even if it is killed, so the
	// cleanup below never walks into a host file system.
	args := []string{"--mount", "--propagation", "private", "debootstrap",
		"--variant=" + r.Variant, "--include=" + strings.Join(r.Packages, ","),
		r.Suite, root, mirror}
	if _, err := b.Run.Run(ctx, "unshare", args...); err != nil {
		return Built{}, fmt.Errorf("building image: debootstrap: %w", err)
	}

	progress.report("configure", 0, 0)
	if err := customize(ctx, b.Run, root, r); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	kernel, initrd, err := findKernel(root)
	if err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	// The uncompressed kernel when it can be entered through PVH (see
	// pvh.go); otherwise the bzImage as the distribution ships it.
	if vmlinux, err := pvhKernel(ctx, b.Run, kernel); err == nil {
		if err := os.WriteFile(filepath.Join(tmp, KernelFile), vmlinux, 0o644); err != nil {
			return Built{}, fmt.Errorf("building image: %w", err)
		}
	} else if errors.Is(err, errNoPVH) {
		progress.report("kernel: "+err.Error()+"; booting the compressed kernel", 0, 0)
		if err := copyFile(kernel, filepath.Join(tmp, KernelFile), 0o644); err != nil {
			return Built{}, fmt.Errorf("building image: %w", err)
		}
	} else {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	if err := copyFile(initrd, filepath.Join(tmp, InitrdFile), 0o644); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}

	progress.report("mke2fs", 0, 0)
	raw := filepath.Join(tmp, "disk.raw")
	if _, err := b.Run.Run(ctx, "mke2fs", "-q", "-F", "-t", "ext4", "-L", "abox-root", "-d", root, raw, r.DiskSize); err != nil {
		return Built{}, fmt.Errorf("building image: making the file system: %w", err)
	}
	if err := removeTree(root); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	progress.report("qemu-img convert", 0, 0)
	disk := filepath.Join(tmp, DiskFile)
	if _, err := b.Run.Run(ctx, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, disk); err != nil {
		return Built{}, fmt.Errorf("building image: converting to qcow2: %w", err)
	}
	if err := os.Remove(raw); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	sum, _, err := fileSHA256(disk)
	if err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	bt := Built{
		Recipe:   hash,
		Disk:     DiskFile,
		Kernel:   KernelFile,
		Initrd:   InitrdFile,
		Cmdline:  r.Cmdline,
		SHA256:   sum,
		Created:  time.Now().UTC(),
		Duration: time.Since(start).Round(time.Second).String(),
	}
	if err := writeJSON(filepath.Join(tmp, BuildFile), bt); err != nil {
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	final := filepath.Join(cacheDir, hash)
	if err := os.Rename(tmp, final); err != nil {
		// Someone else finished the same recipe first: theirs is as good.
		if existing, lerr := LookupBuilt(r, cacheDir); lerr == nil {
			return existing, nil
		}
		return Built{}, fmt.Errorf("building image: %w", err)
	}
	committed = true
	progress.report("done", 0, 0)
	bt, err = LookupBuilt(r, cacheDir)
	bt.Cached = false
	return bt, err
}

// customize applies the recipe's files, symlinks, units and removals to the
// debootstrapped tree at root.
func customize(ctx context.Context, run Runner, root string, r Recipe) error {
	for _, pat := range r.Remove {
		matches, err := filepath.Glob(filepath.Join(root, pat))
		if err != nil {
			return fmt.Errorf("removing %s: %w", pat, err)
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return fmt.Errorf("removing %s: %w", m, err)
			}
		}
	}
	for _, p := range sortedKeys(r.Files) {
		dst := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		// Remove first: the package may have left a symlink there, and
		// writing through it would land outside the tree.
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := os.WriteFile(dst, []byte(r.Files[p]), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	for _, p := range sortedKeys(r.Symlinks) {
		dst := filepath.Join(root, p)
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("linking %s: %w", p, err)
		}
		if err := os.Symlink(r.Symlinks[p], dst); err != nil {
			return fmt.Errorf("linking %s: %w", p, err)
		}
	}
	if len(r.Enable) > 0 {
		// systemctl enable works offline on a tree: it only makes symlinks.
		args := append([]string{root, "systemctl", "enable"}, r.Enable...)
		if _, err := run.Run(ctx, "chroot", args...); err != nil {
			return fmt.Errorf("enabling units: %w", err)
		}
	}
	if len(r.Disable) > 0 {
		args := append([]string{root, "systemctl", "disable"}, r.Disable...)
		if _, err := run.Run(ctx, "chroot", args...); err != nil {
			return fmt.Errorf("disabling units: %w", err)
		}
	}
	for _, c := range r.Chroot {
		if _, err := run.Run(ctx, "chroot", append([]string{root}, c...)...); err != nil {
			return fmt.Errorf("running %s in the image: %w", strings.Join(c, " "), err)
		}
	}
	return nil
}

// findKernel returns the newest kernel and its initrd in root/boot.
func findKernel(root string) (kernel, initrd string, err error) {
	ks, err := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if err != nil || len(ks) == 0 {
		return "", "", fmt.Errorf("finding the kernel: no %s", filepath.Join(root, "boot", "vmlinuz-*"))
	}
	// Versions compare numerically: 6.1.0-18 is newer than 6.1.0-9.
	sort.Slice(ks, func(i, j int) bool { return naturalLess(ks[i], ks[j]) })
	kernel = ks[len(ks)-1]
	version := strings.TrimPrefix(filepath.Base(kernel), "vmlinuz-")
	initrd = filepath.Join(root, "boot", "initrd.img-"+version)
	if _, err := os.Stat(initrd); err != nil {
		return "", "", fmt.Errorf("finding the initrd: %w", err)
	}
	return kernel, initrd, nil
}

// naturalLess compares strings with runs of digits compared as numbers.
func naturalLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := digitPrefix(a), digitPrefix(b)
		if da != "" && db != "" {
			na, nb := strings.TrimLeft(da, "0"), strings.TrimLeft(db, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = a[len(da):], b[len(db):]
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func digitPrefix(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// removeTree deletes dir after making sure nothing is mounted below it:
// deleting through a leftover bind mount of /dev or /proc would reach the
// host. Mounts found are detached first.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	// Deepest first.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i]) > len(mounts[j]) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("removing %s: unmounting %s: %w", dir, m, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	return nil
}

// mountsUnder lists mount points at or below dir from /proc/self/mountinfo.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	dir = filepath.Clean(dir)
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space and so on).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
