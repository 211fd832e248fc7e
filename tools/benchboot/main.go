// Command benchboot measures how long a new sandbox takes to become usable:
// it brings up the offline lab (package e2e/lab), creates an instance from
// the cached Debian 12 base, runs `abox start` (which waits for SSH and
// cloud-init) and prints start→SSH and start→ready, then the phases the
// guest itself reports (systemd-analyze, cloud-init analyze). Each round is
// a first boot of a new instance, the case every user and test pays. Run it
// as root from the module root (make bench-boot).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

func main() {
	rounds := flag.Int("rounds", 1, "first boots to measure (a new instance each)")
	cpus := flag.Int("cpus", 2, "guest vCPUs")
	accel := flag.String("accel", "tcg", "accelerator: tcg, kvm or auto")
	verbose := flag.Bool("v", false, "print the guest's full systemd and cloud-init reports")
	flag.Func("probe", "a guest command to run after each boot, output printed (repeatable)", func(s string) error {
		probes = append(probes, s)
		return nil
	})
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *rounds, *cpus, *accel, *verbose); err != nil {
		fmt.Fprintf(os.Stderr, "benchboot: %v\n", err)
		os.Exit(1)
	}
}

// probes are extra guest commands (-probe), for looking into a phase.
var probes []string

type round struct {
	hostSide  time.Duration // abox start invoked → domain started
	toSSH     time.Duration // domain started → first SSH answer
	toReady   time.Duration // domain started → cloud-init finished
	total     time.Duration // abox start invoked → it returned (ready)
	kernel    time.Duration
	userspace time.Duration
	ciStages  []string // "init 2.306": the work of each stage, in order
	blame     []string // the slowest units
}

func run(ctx context.Context, rounds, cpus int, accel string, verbose bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: it starts libvirtd and VMs in a network namespace")
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "benchboot: base image (built once, then cached)")
	if _, err := (image.Builder{Run: image.ExecRunner{}}).BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), nil); err != nil {
		return err
	}
	l, err := lab.Start(ctx, root, "bboot", nil)
	if err != nil {
		return err
	}
	defer l.Close(context.WithoutCancel(ctx))
	if out, err := l.Abox(ctx, "base", "build", "debian-12"); err != nil {
		return fmt.Errorf("importing the base: %v\n%s", err, out)
	}
	allow := filepath.Join(l.Env.Dir, "allowlist.txt")
	if err := os.WriteFile(allow, []byte("allowed.test\n"), 0o600); err != nil {
		return err
	}
	var rs []round
	for i := 0; i < rounds; i++ {
		name := fmt.Sprintf("boot%d", i)
		r, err := measure(ctx, l, name, allow, cpus, accel, verbose)
		l.Abox(context.WithoutCancel(ctx), "remove", "--force", name)
		if err != nil {
			return err
		}
		rs = append(rs, r)
		fmt.Fprintf(os.Stderr, "benchboot: round %d: ready %.1fs after start\n", i+1, r.toReady.Seconds())
	}
	report(rs, cpus, accel)
	return nil
}

func measure(ctx context.Context, l *lab.Lab, name, allow string, cpus int, accel string, verbose bool) (round, error) {
	var r round
	if out, err := l.Abox(ctx, "create", name, "--accel", accel, "--cpus", strconv.Itoa(cpus), "--allowlist", allow,
		"--upstream", lab.Upstream, "--upstream-ca", l.OriginCA); err != nil {
		return r, fmt.Errorf("create: %v\n%s", err, out)
	}
	t0 := time.Now()
	if out, err := l.Abox(ctx, "start", name); err != nil {
		return r, fmt.Errorf("start: %v\n%s", err, out)
	}
	r.total = time.Since(t0)
	b, err := instance.LastBoot(paths.Layout{Root: l.Home}, name)
	if err != nil {
		return r, err
	}
	r.hostSide = b.StartedAt.Sub(t0)
	r.toSSH = b.SSHAt.Sub(b.StartedAt)
	r.toReady = b.ReadyAfter()
	guest := func(cmd string) string {
		out, _ := l.Abox(ctx, "ssh", name, "--", cmd)
		return out
	}
	sa := guest("systemd-analyze time")
	r.kernel, _, r.userspace = parseAnalyze(sa)
	r.blame = firstLines(guest("systemd-analyze blame --no-pager"), 8)
	// cloud-init's own timing of each stage's work, after Python started
	// (`cloud-init analyze` fails on this version's logs).
	r.ciStages = firstLines(stageRE.ReplaceAllString(guest(`grep -oE "cloud-init mode '[a-z]+' took [0-9.]+ seconds" /var/log/cloud-init.log`), "$1 $2"), 4)
	if verbose {
		fmt.Println(sa)
		fmt.Println(guest("systemd-analyze critical-chain --no-pager"))
	}
	for _, p := range probes {
		fmt.Printf("guest$ %s\n%s\n", p, guest(p))
	}
	return r, nil
}

var analyzeRE = regexp.MustCompile(`([0-9.]+(?:min|s|ms)) \((kernel|initrd|userspace)\)`)

// parseAnalyze reads "Startup finished in 3.1s (kernel) + 2.0s (initrd) + 20.5s (userspace)".
func parseAnalyze(s string) (kernel, initrd, user time.Duration) {
	for _, m := range analyzeRE.FindAllStringSubmatch(s, -1) {
		d := parseSystemdDuration(m[1])
		switch m[2] {
		case "kernel":
			kernel = d
		case "initrd":
			initrd = d
		case "userspace":
			user = d
		}
	}
	return
}

var partRE = regexp.MustCompile(`([0-9.]+)(min|ms|s)`)

func parseSystemdDuration(s string) time.Duration {
	var d time.Duration
	for _, m := range partRE.FindAllStringSubmatch(s, -1) {
		f, _ := strconv.ParseFloat(m[1], 64)
		switch m[2] {
		case "min":
			d += time.Duration(f * float64(time.Minute))
		case "s":
			d += time.Duration(f * float64(time.Second))
		case "ms":
			d += time.Duration(f * float64(time.Millisecond))
		}
	}
	return d
}

var stageRE = regexp.MustCompile(`cloud-init mode '([a-z]+)' took ([0-9.]+) seconds`)

func firstLines(s string, n int) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		if l = strings.TrimSpace(l); l != "" && len(out) < n {
			out = append(out, l)
		}
	}
	return out
}

func report(rs []round, cpus int, accel string) {
	sec := func(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }
	fmt.Printf("\nFirst boot of a new instance (Debian 12 base, %d vCPU, accel %s), seconds\n", cpus, accel)
	// The kernel phase includes the initrd: Debian's initramfs does not run systemd.
	fmt.Printf("%-6s %9s %9s %9s %9s | %7s %9s | %s\n", "round", "host", "→ssh", "→ready", "start cmd", "kernel", "userspace", "cloud-init work per stage (s)")
	for i, r := range rs {
		st := r.ciStages
		fmt.Printf("%-6d %9s %9s %9s %9s | %7s %9s | %s\n", i+1, sec(r.hostSide), sec(r.toSSH), sec(r.toReady), sec(r.total),
			sec(r.kernel), sec(r.userspace), strings.Join(st, ", "))
	}
	last := rs[len(rs)-1]
	fmt.Printf("slowest units (last round): %s\n", strings.Join(last.blame, "; "))
	b, _ := json.Marshal(map[string]any{"goal_ready_s": 30, "ready_s": last.toReady.Seconds()})
	fmt.Printf("FIGURE boot %s\n", b)
}
