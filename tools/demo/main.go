// Command demo is `make demo`: it builds (or reuses) the Debian base image,
// brings up an offline lab network (package e2e/lab: a private libvirtd in a
// network namespace and a stand-in internet), creates and starts an abox
// instance, and shows from inside the guest what gets through and what is
// blocked, with the reasons. Run it as root from the module root.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/image"
)

func main() {
	keep := flag.Bool("keep", false, "leave the lab and the instance running at the end, to explore")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo: %v\n", err)
		os.Exit(1)
	}
}

func heading(format string, args ...any) {
	fmt.Printf("\n\033[1m== %s\033[0m\n", fmt.Sprintf(format, args...))
}

func run(ctx context.Context, keep bool) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("run as root: the demo starts libvirtd and VMs in a network namespace")
	}
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	heading("Base image (Debian 12, built with debootstrap once, then cached)")
	t0 := time.Now()
	built, err := image.Builder{Run: image.ExecRunner{}}.BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"),
		func(stage string, done, total int64) { fmt.Printf("   %s\n", stage) })
	if err != nil {
		return err
	}
	fmt.Printf("   ready in %s (cached: %v)\n", time.Since(t0).Round(time.Second), built.Cached)

	heading("Lab network (offline: a namespace with its own libvirtd, and a stand-in internet)")
	l, err := lab.Start(ctx, root, "demo", nil)
	if err != nil {
		return err
	}
	if !keep {
		defer func() {
			heading("Cleaning up")
			l.Abox(context.WithoutCancel(ctx), "remove", "--force", "demo")
			l.Close(context.WithoutCancel(ctx))
		}()
	}
	fmt.Printf("   origin %s serves allowed.test and blocked.test; upstream DNS %s\n", lab.OriginIP, lab.Upstream)

	abox := func(args ...string) error {
		fmt.Printf("\033[2m$ abox %s\033[0m\n", strings.Join(args, " "))
		cmd := l.AboxCmd(ctx, args...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		return cmd.Run()
	}
	if err := abox("base", "build", "debian-12"); err != nil {
		return err
	}
	allow := filepath.Join(l.Env.Dir, "allowlist.txt")
	if err := os.WriteFile(allow, []byte("allowed.test\n*.allowed.test\n"), 0o644); err != nil {
		return err
	}
	heading("Create and start an instance")
	if err := abox("create", "demo", "--accel", "tcg", "--cpus", "2", "--allowlist", allow,
		"--upstream", lab.Upstream, "--upstream-ca", l.OriginCA); err != nil {
		return err
	}
	t0 = time.Now()
	// start waits until the guest answers SSH and cloud-init has finished.
	if err := abox("start", "demo"); err != nil {
		return err
	}
	fmt.Printf("   ready %s after start (software emulation here; with KVM a few seconds)\n", time.Since(t0).Round(time.Second))

	guest := func(what, command string) {
		heading("%s", what)
		fmt.Printf("\033[2mguest$ %s\033[0m\n", command)
		cmd := l.AboxCmd(ctx, "ssh", "demo", "--", command)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		if err := cmd.Run(); err != nil {
			fmt.Printf("   (exit: %v)\n", err)
		}
	}
	guest("An allowlisted site over HTTPS (the proxy intercepts TLS with the instance CA, which the guest trusts)",
		"curl -sS -m 30 https://allowed.test/hello")
	guest("A name that is not allowlisted: NXDOMAIN, with the reason in an Extended DNS Error",
		// Ask the gateway directly: the guest's local stub resolver does not pass EDE on.
		"dig +tries=1 @$(ip -4 route show default | cut -d' ' -f3) blocked.test | grep -E 'status:|EDE'")
	guest("A URL that is not allowlisted: 403 from the proxy, with its reason",
		"curl -sS -m 20 -i http://blocked.test/ | grep -iE '^HTTP|^x-abox|blocked'")
	guest("A private address through the proxy (SSRF protection)",
		"curl -sS -m 20 -i http://10.0.0.5/ | grep -iE '^HTTP|^x-abox-reason'")
	guest("A direct connection that bypasses the proxy: dropped by the packet filter",
		"curl -sS -m 5 --noproxy '*' http://"+lab.OriginIP+"/ 2>&1 || echo '=> blocked'")
	heading("The filters' decision logs")
	abox("dns", "logs", "demo", "-n", "3")
	abox("http", "logs", "demo", "-n", "3")

	heading("Next")
	fmt.Printf(`   This demo ran offline inside network namespace %s.
   On a host with internet access the same steps are:
       abox base build debian-12
       abox create dev && abox start dev && abox ssh dev
   `, l.Env.Name)
	if keep {
		fmt.Printf(`To explore this lab instance:
       ip netns exec %s env ABOX_HOME=%s ABOX_LIBVIRT_SOCKET=%s %s ssh demo
`, l.Env.Name, l.Home, l.Env.Socket, filepath.Join(l.Bin, "abox"))
	}
	fmt.Println()
	return nil
}
