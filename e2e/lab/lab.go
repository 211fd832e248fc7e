// Package lab sets up a self-contained network for running abox against real
// guests on a machine without internet: a namespace with a private libvirtd
// (package harness), a second namespace standing in for the internet with an
// HTTP(S) origin and a DNS server on public-looking addresses that exist only
// there, and a fake upstream resolver. The VM end-to-end suite and `make demo`
// both use it; nothing it makes is reachable from, or reaches, the real network.
package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/e2e/harness"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// Addresses of the stand-in internet.
const (
	HostSide   = "11.22.33.1"     // the lab namespace's end of the veth (a host address)
	OriginIP   = "11.22.33.44"    // HTTP :80, HTTPS :443 and DNS :53 origin
	Upstream   = "127.0.0.1:5300" // the upstream resolver the filters use, in the lab namespace
	HostListen = ":8081"          // a service on every host address, which guests must not reach
)

// CodeHost is the stand-in code host on the origin: git's smart HTTP
// (git http-backend, reads and pushes) for the bare repositories in
// Lab.GitRoot; CodeRepo is one of them, with one commit on main. A push
// needs Basic auth whose password is the content of Lab.GitTokenFile.
const (
	CodeHost = "code.test"
	CodeRepo = "app.git"
)

// APIHost is the stand-in API on the origin: it answers only requests
// with "Authorization: Bearer TOKEN", TOKEN being the content of
// Lab.TokenFile (read at every request), and 401 to any other.
const APIHost = "api.test"

// Records answered by both the upstream resolver and the origin's DNS.
var Records = map[string]string{
	"allowed.test":     OriginIP,
	"www.allowed.test": OriginIP,
	"blocked.test":     OriginIP,
	"late.test":        OriginIP,
	CodeHost:           OriginIP,
	APIHost:            OriginIP,
	"private.test":     "10.0.0.5",
	"loop.test":        "127.0.0.1",
}

// Lab is a running lab. Fields are read-only after Start.
type Lab struct {
	Env      *harness.Env
	OriginNS string
	Bin      string // directory holding abox, fakedns and testorigin
	Home     string // ABOX_HOME of the lab
	OriginCA string // PEM of the origin's CA, for --upstream-ca
	GitRoot  string // the bare repositories CodeHost serves
	// TokenFile holds the token APIHost accepts (none until a test
	// writes it).
	TokenFile string
	// GitTokenFile holds the password CodeHost takes for a push, as
	// Basic auth (none until a test writes it: every push is refused).
	GitTokenFile string

	procs []*exec.Cmd
	logf  func(string, ...any)
}

// Start builds the tools from the module at moduleRoot and brings the lab up.
// name must be unique among concurrent labs (letters, digits, '-').
func Start(ctx context.Context, moduleRoot, name string, logf func(string, ...any)) (_ *Lab, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	env, err := harness.Start(ctx, name, harness.Options{Logf: logf})
	if err != nil {
		return nil, err
	}
	l := &Lab{Env: env, OriginNS: env.Name + "-o", Home: filepath.Join(env.Dir, "home"), Bin: filepath.Join(env.Dir, "bin"), logf: logf}
	defer func() {
		if err != nil {
			l.Close(context.WithoutCancel(ctx))
		}
	}()
	for _, tool := range []string{"cmd/abox", "tools/fakedns", "tools/testorigin"} {
		cmd := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(l.Bin, filepath.Base(tool)), "./"+tool)
		cmd.Dir = moduleRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building %s: %w\n%s", tool, err, out)
		}
	}
	if err := l.installHook(ctx); err != nil {
		return nil, err
	}
	if err := l.startOrigin(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// HooksDir is the lab libvirtd's hook directory, as abox sees it (the
// daemon sees it at /etc/libvirt/hooks in its mount namespace).
func (l *Lab) HooksDir() string { return filepath.Join(l.Env.Dir, "etc", "hooks") }

// installHook puts abox's libvirt hook in place and restarts libvirtd,
// which looks for hooks only when it starts: like a host where abox was
// installed before libvirtd last started, so every abox start is checked
// by the hook and would fail if it did not run.
func (l *Lab) installHook(ctx context.Context) error {
	if _, err := instance.InstallHook(l.HooksDir(), filepath.Join(l.Bin, "abox")); err != nil {
		return err
	}
	return l.RestartLibvirtd(ctx)
}

// RestartLibvirtd stops the lab's libvirtd (running guests keep running)
// and starts it again.
func (l *Lab) RestartLibvirtd(ctx context.Context) error {
	pidFile := filepath.Join(l.Env.Dir, "libvirtd.pid")
	if b, err := os.ReadFile(pidFile); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			syscall.Kill(pid, syscall.SIGTERM)
			deadline := time.Now().Add(30 * time.Second)
			for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	return l.Env.StartLibvirtd(ctx)
}

func run(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (l *Lab) startOrigin(ctx context.Context) error {
	exec.CommandContext(ctx, "ip", "netns", "del", l.OriginNS).Run() // a crashed run's leftover
	steps := [][]string{
		// Forwarding on, as on a host with Docker or libvirt's NAT
		// network: the chains, not the kernel's default, must stop
		// the guest's forwarded traffic in every test.
		{"ip", "netns", "exec", l.Env.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "netns", "add", l.OriginNS},
		{"ip", "-n", l.Env.Name, "link", "add", "lab-vo0", "type", "veth", "peer", "name", "lab-vo1", "netns", l.OriginNS},
		{"ip", "-n", l.Env.Name, "addr", "add", HostSide + "/24", "dev", "lab-vo0"},
		{"ip", "-n", l.Env.Name, "link", "set", "lab-vo0", "up"},
		{"ip", "-n", l.OriginNS, "addr", "add", OriginIP + "/24", "dev", "lab-vo1"},
		{"ip", "-n", l.OriginNS, "link", "set", "lab-vo1", "up"},
		{"ip", "-n", l.OriginNS, "link", "set", "lo", "up"},
		// Replies to guests, should anything ever be forwarded to the origin.
		{"ip", "-n", l.OriginNS, "route", "add", "10.10.0.0/16", "via", HostSide},
	}
	for _, s := range steps {
		if err := run(ctx, s...); err != nil {
			return fmt.Errorf("setting up the origin network: %w", err)
		}
	}
	l.OriginCA = filepath.Join(l.Env.Dir, "origin-ca.pem")
	l.TokenFile = filepath.Join(l.Env.Dir, "api-token")
	l.GitTokenFile = filepath.Join(l.Env.Dir, "git-token")
	if err := l.makeRepo(ctx); err != nil {
		return err
	}
	var names []string
	var records []string
	for n, a := range Records {
		records = append(records, "--a", n+"="+a)
		if a == OriginIP {
			names = append(names, n)
		}
	}
	if err := l.background(ctx, "ip", "netns", "exec", l.OriginNS, filepath.Join(l.Bin, "testorigin"),
		"--http", OriginIP+":80", "--https", OriginIP+":443", "--names", strings.Join(append(names, OriginIP), ","), "--ca-out", l.OriginCA,
		"--git-host", CodeHost, "--git-root", l.GitRoot, "--token-host", APIHost, "--token-file", l.TokenFile,
		"--git-push-token-file", l.GitTokenFile); err != nil {
		return err
	}
	if err := l.background(ctx, append([]string{"ip", "netns", "exec", l.OriginNS, filepath.Join(l.Bin, "fakedns"), "--listen", OriginIP + ":53"}, records...)...); err != nil {
		return err
	}
	if err := l.background(ctx, append([]string{"ip", "netns", "exec", l.Env.Name, filepath.Join(l.Bin, "fakedns"), "--listen", Upstream}, records...)...); err != nil {
		return err
	}
	if err := l.background(ctx, "ip", "netns", "exec", l.Env.Name, filepath.Join(l.Bin, "testorigin"), "--http", HostListen, "--https", "", "--body", "HOST SERVICE"); err != nil {
		return err
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(l.OriginCA); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the origin server did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// makeRepo makes CodeRepo under GitRoot: a bare repository with one
// commit on main that accepts pushes (http.receivepack), so that only
// the filters stand between a guest and a write.
func (l *Lab) makeRepo(ctx context.Context) error {
	l.GitRoot = filepath.Join(l.Env.Dir, "git")
	src := filepath.Join(l.Env.Dir, "git-src")
	os.RemoveAll(l.GitRoot)
	os.RemoveAll(src)
	git := func(args ...string) error {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=lab", "GIT_AUTHOR_EMAIL=lab@code.test", "GIT_COMMITTER_NAME=lab", "GIT_COMMITTER_EMAIL=lab@code.test", "GIT_CONFIG_NOSYSTEM=1", "HOME="+l.Env.Dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	bare := filepath.Join(l.GitRoot, CodeRepo)
	for _, step := range [][]string{
		{"init", "-q", "-b", "main", src},
		{"-C", src, "commit", "-q", "--allow-empty", "-m", "the lab's first commit"},
		{"clone", "-q", "--bare", src, bare},
		{"-C", bare, "config", "http.receivepack", "true"},
	} {
		if err := git(step...); err != nil {
			return fmt.Errorf("making the lab's code host repository: %w", err)
		}
	}
	return nil
}

func (l *Lab) background(ctx context.Context, args ...string) error {
	cmd := exec.Command(args[0], args[1:]...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err
	}
	l.procs = append(l.procs, cmd)
	return nil
}

// Abox runs the abox CLI inside the lab namespace and returns its combined output.
func (l *Lab) Abox(ctx context.Context, args ...string) (string, error) {
	cmd := l.AboxCmd(ctx, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// AboxCmd is the command Abox runs, for callers that stream its output.
func (l *Lab) AboxCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := l.Env.NetCommand(ctx, filepath.Join(l.Bin, "abox"), args...)
	cmd.Env = append(os.Environ(), paths.EnvHome+"="+l.Home, "ABOX_LIBVIRT_SOCKET="+l.Env.Socket, instance.EnvHooksDir+"="+l.HooksDir())
	return cmd
}

// InNS runs a command in the lab namespace (the host side of every bridge).
func (l *Lab) InNS(ctx context.Context, name string, args ...string) (string, error) {
	out, err := l.Env.NetCommand(ctx, name, args...).CombinedOutput()
	return string(out), err
}

// Close stops the lab's servers and tears both namespaces down.
func (l *Lab) Close(ctx context.Context) error {
	for _, p := range l.procs {
		p.Process.Kill()
		p.Wait()
	}
	exec.CommandContext(ctx, "ip", "netns", "del", l.OriginNS).Run()
	return l.Env.Close(ctx)
}
