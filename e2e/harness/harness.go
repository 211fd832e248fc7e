// Package harness gives VM end-to-end tests a network namespace of their own with a private libvirtd running inside it.
//
// Everything a test makes lives in that namespace: libvirt's bridges, the
// guests' taps, firewall rules, filters and fake upstream servers. The
// daemons also get a private mount namespace in which /run/libvirt,
// /etc/libvirt, /var/lib/libvirt and /var/log/libvirt are directories under
// the environment's state directory, so they never clash with a host
// libvirtd or with another environment. Teardown is by name and safe to
// repeat, so a run after a crash first cleans what the crashed run left.
package harness

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Prefix starts every network namespace the harness creates, so that
// leftovers are recognisable (`ip netns list | grep abxe2e-`).
const Prefix = "abxe2e-"

// DefaultStateRoot holds one directory per environment.
const DefaultStateRoot = "/tmp/abox-e2e"

// DefaultCapsCache keeps libvirt's QEMU capability probes across runs: with
// it warm, libvirtd answers in ~0.1 s instead of ~4 s.
const DefaultCapsCache = "/var/cache/abox/libvirt-cache"

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,20}$`)

// Options configure Start. The zero value is usable.
type Options struct {
	// StateRoot is where the environment's directory is made; default
	// DefaultStateRoot. It must be traversable by libvirt's qemu user if
	// guests' files live below it.
	StateRoot string
	// CapsCache is bound over /var/cache/libvirt; default DefaultCapsCache.
	CapsCache string
	// HostKVM leaves the host's /dev/kvm as it is. By default the private
	// mount namespace gets a copy of the node that is root:kvm 0660, as
	// Debian's udev rule makes it: on hosts without udev it is root-only
	// 0600, so libvirt (root) sees KVM but its qemu user does not, decides
	// its capability cache is stale and re-probes QEMU on every start
	// (~12 s instead of ~0.1 s). Guests still run type='qemu' (TCG).
	HostKVM bool
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// Env is one running environment. Fields are set by Start and read-only.
type Env struct {
	Name      string        // network namespace name, Prefix + the caller's name
	Dir       string        // state directory: run/ etc/ lib/ log/ live here
	Socket    string        // libvirtd's read-write socket, a host path
	URI       string        // libvirt URI for the socket, usable from the host or the netns
	HolderPID int           // process that keeps the private mount namespace alive
	Startup   time.Duration // from starting libvirtd to its answering an API call

	logf func(format string, args ...any)
	lock *os.File // flock held for the environment's life: one run per name
}

// NetnsName returns the namespace name Start uses for name.
func NetnsName(name string) string { return Prefix + name }

// Start creates the environment called name (lowercase letters, digits and
// '-', at most 21 characters; unique per concurrent test run). A leftover
// environment of the same name is torn down first.
func Start(ctx context.Context, name string, opts Options) (_ *Env, err error) {
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("starting e2e environment %q: name must match %s", name, nameRE)
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("starting e2e environment: needs root")
	}
	if opts.StateRoot == "" {
		opts.StateRoot = DefaultStateRoot
	}
	if opts.CapsCache == "" {
		opts.CapsCache = DefaultCapsCache
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	ns := NetnsName(name)
	dir := filepath.Join(opts.StateRoot, ns)
	e := &Env{
		Name:   ns,
		Dir:    dir,
		Socket: filepath.Join(dir, "run", "libvirt-sock"),
		logf:   logf,
	}
	e.URI = "qemu+unix:///system?socket=" + e.Socket

	// Two runs of one name would tear each other's guests down: the
	// second waits for the first instead.
	if err := os.MkdirAll(opts.StateRoot, 0o755); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	lock, err := takeLock(ctx, filepath.Join(opts.StateRoot, ns+".lock"), logf)
	if err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	e.lock = lock
	defer func() {
		if err != nil {
			dropLock(lock)
		}
	}()

	if err := teardown(ctx, ns, dir, logf); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: cleaning leftovers: %w", ns, err)
	}
	defer func() {
		if err != nil {
			if terr := teardown(context.WithoutCancel(ctx), ns, dir, logf); terr != nil {
				err = errors.Join(err, fmt.Errorf("rolling back: %w", terr))
			}
		}
	}()

	for _, d := range []string{"run", "etc", "lib", "log", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
		}
	}
	// The state root may be created 0700 by a umask; qemu runs as
	// libvirt-qemu and must traverse it to reach logs and sockets.
	for _, d := range []string{opts.StateRoot, dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
		}
	}
	if err := os.MkdirAll(opts.CapsCache, 0o755); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	if err := copyLibvirtConfig("/etc/libvirt", filepath.Join(dir, "etc")); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	if err := makeStateDirs(dir); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}

	if out, err := run(ctx, "ip", "netns", "add", ns); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: creating the namespace: %w: %s", ns, err, out)
	}
	if out, err := run(ctx, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: bringing up lo: %w: %s", ns, err, out)
	}

	if err := e.startHolder(ctx, opts); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	if err := e.StartLibvirtd(ctx); err != nil {
		return nil, fmt.Errorf("starting e2e environment %s: %w", ns, err)
	}
	logf("harness: %s ready, libvirtd answered after %s", ns, e.Startup.Round(time.Millisecond))
	return e, nil
}

// holderScript runs as root inside the new network namespace and a new
// private mount namespace; it binds the state directories over libvirt's
// paths and then sleeps, keeping the mount namespace alive for the daemons
// that nsenter into it.
const holderScript = `set -eu
D=$1
CACHE=$2
GROUPKVM=$3
mount --make-rprivate /
mkdir -p /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt
mount --bind "$D/run" /run/libvirt
mount --bind "$D/etc" /etc/libvirt
mount --bind "$D/lib" /var/lib/libvirt
mount --bind "$D/log" /var/log/libvirt
mount --bind "$CACHE" /var/cache/libvirt
if [ "$GROUPKVM" = 1 ] && [ -c /dev/kvm ]; then
	mknod "$D/kvm" c "0x$(stat -c %t /dev/kvm)" "0x$(stat -c %T /dev/kvm)"
	chgrp kvm "$D/kvm"
	chmod 0660 "$D/kvm"
	mount --bind "$D/kvm" /dev/kvm
fi
echo ready > "$D/holder.ready"
exec sleep infinity
`

func (e *Env) startHolder(ctx context.Context, opts Options) error {
	groupKVM := "1"
	if opts.HostKVM {
		groupKVM = "0"
	}
	script := filepath.Join(e.Dir, "holder.sh")
	if err := os.WriteFile(script, []byte(holderScript), 0o755); err != nil {
		return fmt.Errorf("starting the mount namespace: %w", err)
	}
	logFile, err := os.Create(filepath.Join(e.Dir, "holder.log"))
	if err != nil {
		return fmt.Errorf("starting the mount namespace: %w", err)
	}
	defer logFile.Close()
	// Not CommandContext: the holder must outlive this call; teardown kills
	// it by namespace membership.
	cmd := exec.Command("ip", "netns", "exec", e.Name,
		"unshare", "--mount", "--propagation", "private",
		"sh", script, e.Dir, opts.CapsCache, groupKVM)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the mount namespace: %w", err)
	}
	e.HolderPID = cmd.Process.Pid
	// Reap it whenever it exits so it does not linger as a zombie.
	go cmd.Wait()
	ready := filepath.Join(e.Dir, "holder.ready")
	if err := poll(ctx, 10*time.Second, func() (bool, error) {
		if _, err := os.Stat(ready); err == nil {
			return true, nil
		}
		if syscall.Kill(e.HolderPID, 0) != nil {
			b, _ := os.ReadFile(filepath.Join(e.Dir, "holder.log"))
			return false, fmt.Errorf("holder exited: %s", strings.TrimSpace(string(b)))
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("starting the mount namespace: %w", err)
	}
	// ip netns exec and unshare exec in place, so the pid we started is the
	// one that sleeps inside both namespaces.
	return nil
}

// StartLibvirtd starts virtlogd (if not running) and libvirtd inside the
// environment and waits until libvirtd answers. Tests that kill libvirtd can
// call it again.
func (e *Env) StartLibvirtd(ctx context.Context) error {
	if !alive(pidFromFile(filepath.Join(e.Dir, "virtlogd.pid"))) {
		// Pid files go to the state directory: the defaults under /run are
		// shared with the host and a second daemon would refuse to start.
		if out, err := e.Command(ctx, "virtlogd", "-d", "-p", filepath.Join(e.Dir, "virtlogd.pid")).CombinedOutput(); err != nil {
			return fmt.Errorf("starting virtlogd: %w: %s", err, out)
		}
	}
	start := time.Now()
	if out, err := e.Command(ctx, "libvirtd", "-d", "-p", filepath.Join(e.Dir, "libvirtd.pid")).CombinedOutput(); err != nil {
		return fmt.Errorf("starting libvirtd: %w: %s", err, out)
	}
	err := poll(ctx, 90*time.Second, func() (bool, error) {
		c, err := net.Dial("unix", e.Socket)
		if err != nil {
			return false, nil
		}
		c.Close()
		// The socket accepts before the drivers are up; an API call proves
		// the daemon is ready.
		cmd := exec.CommandContext(ctx, "virsh", "-q", "-c", e.URI, "version")
		return cmd.Run() == nil, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for libvirtd (log %s): %w", filepath.Join(e.Dir, "log", "libvirtd.log"), err)
	}
	e.Startup = time.Since(start)
	return nil
}

// Command runs a program inside the environment: its network namespace and
// the daemons' private mount namespace, so libvirt's default paths
// (qemu:///system, /run/libvirt/libvirt-sock) work unchanged.
func (e *Env) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	a := append([]string{"--target", strconv.Itoa(e.HolderPID), "--net", "--mount", "--", name}, args...)
	return exec.CommandContext(ctx, "nsenter", a...)
}

// NetCommand runs a program in the network namespace only (ip netns exec),
// seeing the host's file systems; libvirt is then reached through e.Socket.
func (e *Env) NetCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	a := append([]string{"netns", "exec", e.Name, name}, args...)
	return exec.CommandContext(ctx, "ip", a...)
}

// Virsh runs virsh against the environment's libvirtd and returns its
// combined output.
func (e *Env) Virsh(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", e.URI}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// LogDir is libvirt's log directory (libvirtd.log, qemu/<domain>.log).
func (e *Env) LogDir() string { return filepath.Join(e.Dir, "log") }

// Close tears the environment down: every process in the namespace (guests,
// daemons, the holder), the namespace with its bridges, and the state
// directory. The capability cache is kept.
func (e *Env) Close(ctx context.Context) error {
	err := teardown(ctx, e.Name, e.Dir, e.logf)
	if e.lock != nil {
		dropLock(e.lock)
		e.lock = nil
	}
	return err
}

// The locks this process holds, by path: a Start of a name this process
// already runs takes the environment over (the old one is the leftover it
// tears down), as a crashed run's would be; another process waits. Each
// Start counts a holder; the last one's Close releases the flock (and an
// environment never closed holds it until the process ends).
var (
	locksMu sync.Mutex
	locks   = map[*os.File]*heldLock{}
	byPath  = map[string]*os.File{}
)

type heldLock struct {
	path    string
	holders int
}

func takeLock(ctx context.Context, path string, logf func(string, ...any)) (*os.File, error) {
	locksMu.Lock()
	if f := byPath[path]; f != nil {
		locks[f].holders++
		locksMu.Unlock()
		return f, nil
	}
	locksMu.Unlock()
	f, err := lockName(ctx, path, logf)
	if err != nil {
		return nil, err
	}
	locksMu.Lock()
	byPath[path], locks[f] = f, &heldLock{path: path, holders: 1}
	locksMu.Unlock()
	return f, nil
}

func dropLock(f *os.File) {
	locksMu.Lock()
	defer locksMu.Unlock()
	h := locks[f]
	if h == nil {
		return
	}
	if h.holders--; h.holders > 0 {
		return
	}
	delete(locks, f)
	delete(byPath, h.path)
	f.Close() // closing the descriptor drops the flock
}

// lockName takes an exclusive flock on path, waiting (and saying so) while
// another process holds it, until ctx ends.
func lockName(ctx context.Context, path string, logf func(string, ...any)) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for said := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !said {
			logf("waiting for another run that holds %s", path)
			said = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another run holds %s (the same environment name): %w", path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Cleanup tears down the environment called name under stateRoot (empty
// means DefaultStateRoot), whether or not it is running.
func Cleanup(ctx context.Context, name, stateRoot string) error {
	if stateRoot == "" {
		stateRoot = DefaultStateRoot
	}
	ns := NetnsName(name)
	return teardown(ctx, ns, filepath.Join(stateRoot, ns), func(string, ...any) {})
}

// CleanupPrefix tears down every environment whose name starts with prefix
// (after Prefix): call it from TestMain with a prefix that only this suite
// uses, to clear what a crashed run left behind.
func CleanupPrefix(ctx context.Context, prefix, stateRoot string) error {
	if stateRoot == "" {
		stateRoot = DefaultStateRoot
	}
	names, err := listNetns(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range names {
		if strings.HasPrefix(ns, Prefix+prefix) {
			errs = append(errs, teardown(ctx, ns, filepath.Join(stateRoot, ns), func(string, ...any) {}))
		}
	}
	// State directories whose namespace is already gone.
	entries, _ := os.ReadDir(stateRoot)
	for _, en := range entries {
		if strings.HasPrefix(en.Name(), Prefix+prefix) {
			errs = append(errs, teardown(ctx, en.Name(), filepath.Join(stateRoot, en.Name()), func(string, ...any) {}))
		}
	}
	return errors.Join(errs...)
}

// teardown kills every process in netns ns, deletes it and removes dir.
// Each step runs even when an earlier one failed; all errors are returned.
func teardown(ctx context.Context, ns, dir string, logf func(string, ...any)) error {
	var errs []error
	exists, err := netnsExists(ctx, ns)
	if err != nil {
		errs = append(errs, err)
	}
	if exists {
		if err := killNetns(ctx, ns, logf); err != nil {
			errs = append(errs, err)
		}
		if out, err := run(ctx, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, fmt.Errorf("deleting namespace %s: %w: %s", ns, err, out))
		}
	}
	if _, err := os.Stat(dir); err == nil {
		if m := mountsUnder(dir); len(m) > 0 {
			// Never delete through a mount; this only happens if a process
			// of the namespace escaped the kill.
			errs = append(errs, fmt.Errorf("removing %s: still mounted: %s", dir, strings.Join(m, ", ")))
		} else if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// killNetns sends SIGTERM to every process in ns, waits up to 10 s (qemu
// and libvirtd exit cleanly on TERM), then SIGKILLs what is left.
func killNetns(ctx context.Context, ns string, logf func(string, ...any)) error {
	pids, err := netnsPIDs(ctx, ns)
	if err != nil {
		return err
	}
	if len(pids) == 0 {
		return nil
	}
	logf("harness: stopping %d processes in %s", len(pids), ns)
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if pids, err = netnsPIDs(ctx, ns); err != nil || len(pids) == 0 {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	return poll(ctx, 5*time.Second, func() (bool, error) {
		pids, err := netnsPIDs(ctx, ns)
		return len(pids) == 0, err
	})
}

func netnsPIDs(ctx context.Context, ns string) ([]int, error) {
	out, err := run(ctx, "ip", "netns", "pids", ns)
	if err != nil {
		return nil, fmt.Errorf("listing processes in %s: %w: %s", ns, err, out)
	}
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil && p != os.Getpid() {
			pids = append(pids, p)
		}
	}
	sort.Ints(pids)
	return pids, nil
}

func listNetns(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w: %s", err, out)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			names = append(names, f[0]) // "name (id: 3)"
		}
	}
	return names, nil
}

func netnsExists(ctx context.Context, ns string) (bool, error) {
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
		return true, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("checking namespace %s: %w", ns, err)
	}
	return false, nil
}

// copyLibvirtConfig copies the host's daemon configuration (*.conf) and the
// nwfilter definitions Debian ships (clean-traffic and friends), but not the
// host's defined domains and networks.
func copyLibvirtConfig(src, dst string) error {
	confs, err := filepath.Glob(filepath.Join(src, "*.conf"))
	if err != nil {
		return fmt.Errorf("copying libvirt configuration: %w", err)
	}
	for _, c := range confs {
		if err := copyFile(c, filepath.Join(dst, filepath.Base(c))); err != nil {
			return err
		}
	}
	filters, _ := filepath.Glob(filepath.Join(src, "nwfilter", "*.xml"))
	if len(filters) > 0 {
		if err := os.MkdirAll(filepath.Join(dst, "nwfilter"), 0o755); err != nil {
			return fmt.Errorf("copying libvirt configuration: %w", err)
		}
	}
	for _, f := range filters {
		if err := copyFile(f, filepath.Join(dst, "nwfilter", filepath.Base(f))); err != nil {
			return err
		}
	}
	return nil
}

// stateDirs are the directories Debian's packages create under
// /var/lib/libvirt and /var/log/libvirt, which libvirtd expects to exist,
// plus dnsmasq/: libvirt 9.0 writes <network>.macs there when a guest
// starts, but only creates the directory when it runs dnsmasq, which an
// isolated network with <dns enable='no'/> never does. Without it
// `virsh start` fails with "Failed to create file
// '/var/lib/libvirt/dnsmasq/NET.macs.new'".
var stateDirs = []struct {
	path string
	mode os.FileMode
	qemu bool // owned by libvirt-qemu
}{
	{"lib/boot", 0o711, false},
	{"lib/images", 0o711, false},
	{"lib/qemu", 0o750, true},
	{"lib/qemu/channel", 0o750, true},
	{"lib/qemu/channel/target", 0o750, true},
	{"lib/sanlock", 0o700, false},
	{"lib/dnsmasq", 0o755, false},
	{"log/qemu", 0o755, false},
	{"log/lxc", 0o755, false},
}

func makeStateDirs(dir string) error {
	uid, gid := -1, -1
	if u, err := user.Lookup("libvirt-qemu"); err == nil {
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
	}
	for _, d := range stateDirs {
		p := filepath.Join(dir, d.path)
		if err := os.MkdirAll(p, d.mode); err != nil {
			return fmt.Errorf("making %s: %w", p, err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return fmt.Errorf("making %s: %w", p, err)
		}
		if d.qemu && uid >= 0 {
			if err := os.Chown(p, uid, gid); err != nil {
				return fmt.Errorf("making %s: %w", p, err)
			}
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return bytes.TrimSpace(out), err
}

// poll calls f every 100 ms until it reports done, fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		done, err := f()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up after %s: %w", timeout, ctx.Err())
		case <-t.C:
		}
	}
}

func pidFromFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	p, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return p
}

func alive(pid int) bool { return pid > 0 && syscall.Kill(pid, 0) == nil }

// mountsUnder lists host mount points at or below dir.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}
