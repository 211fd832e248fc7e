package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

func newCreateCmd(e *env) *cobra.Command {
	var s instance.Spec
	var subnet string
	var allowPrivate, allowHost []string
	var ports []uint
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Define a new instance (VM, network, packet filter, filters' config)",
		Long: `Create an instance: a qcow2 overlay on a base image, a cloud-init seed with
the instance's own SSH key, CA and proxy settings, a host-only network with its
own /24, and the libvirt domain with its packet filter. Nothing runs until
` + "`abox start NAME`" + `. A failed create leaves nothing behind.`,
		Example: `  abox create dev
  abox create dev --cpus 4 --memory 4096 --allowlist allow.txt --accel tcg`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			s.Name = args[0]
			if err := validate.InstanceName(s.Name); err != nil {
				return usageError{err}
			}
			if subnet != "" {
				p, err := netip.ParsePrefix(subnet)
				if err != nil {
					return usageError{fmt.Errorf("--subnet %q: want a /24 such as 10.10.7.0/24", subnet)}
				}
				s.Subnet = p
			}
			permit, err := parsePermit("--allow-private", allowPrivate, e.stderr)
			if err != nil {
				return usageError{err}
			}
			s.AllowPrivate = permit
			if s.AllowHost, err = parsePermit("--allow-host", allowHost, e.stderr); err != nil {
				return usageError{err}
			}
			for _, p := range ports {
				if p == 0 || p > 65535 {
					return usageError{fmt.Errorf("--port %d: want 1-65535", p)}
				}
				s.Ports = append(s.Ports, uint16(p))
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			st, warnings, err := m.Create(cmd.Context(), s)
			for _, w := range warnings {
				fmt.Fprintf(e.stderr, "warning: %s\n", w)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "created %s (%s, guest %s); start it with `abox start %s`\n", st.Name, st.Subnet, st.GuestIP, st.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.UintVar(&s.CPUs, "cpus", instance.DefaultCPUs, "virtual CPUs")
	f.UintVar(&s.MemoryMiB, "memory", instance.DefaultMemoryMiB, "memory in MiB")
	f.UintVar(&s.DiskGiB, "disk", instance.DefaultDiskGiB, "disk size in GiB")
	f.StringVar(&s.Base, "base", "debian-12", "base image (see `abox base list`)")
	f.StringVar(&subnet, "subnet", "", "the instance /24 (default: a free one from 10.10.0.0/16)")
	f.StringVar(&s.User, "user", instance.DefaultUser, "login user in the guest")
	f.StringVar(&s.Accel, "accel", "auto", "accelerator: kvm, tcg or auto (auto avoids KVM where it cannot boot a guest)")
	f.StringArrayVar(&s.Upstreams, "upstream", nil, "upstream DNS resolver IP[:PORT] for the filters, repeatable (default: the host's)")
	f.StringArrayVar(&allowPrivate, "allow-private", nil, "private address range the guest may reach through the filters, repeatable")
	f.StringArrayVar(&allowHost, "allow-host", nil, allowHostUsage)
	f.StringVar(&s.Allowlist, "allowlist", "", "initial allowlist FILE")
	f.BoolVar(&s.NoMITM, "no-mitm", false, "do not intercept TLS (CONNECT becomes a checked tunnel)")
	f.StringArrayVar(&s.MITMExceptions, "mitm-exception", nil, "host tunnelled instead of intercepted, repeatable")
	f.UintSliceVar(&ports, "port", nil, "destination ports the proxy allows (default 80,443)")
	f.StringVar(&s.UpstreamCA, "upstream-ca", "", "PEM FILE of extra roots the proxy trusts for origin TLS (besides the system's)")
	f.StringVar(&s.UpstreamProxy, "upstream-proxy", "", "parent proxy http://HOST:PORT for the filters' own egress (no credentials in the URL)")
	f.StringVar(&s.UpstreamProxyCredentials, "upstream-proxy-credentials", "", "FILE holding the parent proxy's USER:PASSWORD on one line")
	f.StringVar(&s.MetricsListen, "metrics-listen", "", "loopback IP:PORT on which the filters also serve Prometheus metrics to a scraper (off by default; see docs/metrics.md)")
	f.StringVar(&s.Template, "template", "", "libvirt domain template FILE (replaces the hardened defaults)")
	f.BoolVar(&s.Monitor, "monitor", false, "runtime monitor: stream the guest's Tetragon events to the host (see docs/monitor.md)")
	f.StringVar(&s.MonitorBundle, "monitor-bundle", "", "install Tetragon in the guest from the bundle `FILE` (upstream's linux-tarball layout, checked first), or the word release for the pinned upstream release (downloaded over https, sha256-verified); implies --monitor")
	return cmd
}

// waitFlags are start's and restart's options for waiting until the guest
// is ready.
type waitFlags struct {
	noWait  bool
	timeout time.Duration
}

func addWaitFlags(cmd *cobra.Command, w *waitFlags, timeoutFlag string) {
	cmd.Flags().BoolVar(&w.noWait, "no-wait", false, "return once the guest is booting, without waiting for SSH and cloud-init")
	cmd.Flags().DurationVar(&w.timeout, timeoutFlag, instance.DefaultReadyTimeout, "how long to wait for SSH and cloud-init")
}

// waitReady waits for the guest unless told not to, and says how long the
// boot took.
func (w waitFlags) waitReady(cmd *cobra.Command, e *env, m *instance.Manager, name string) error {
	if w.noWait {
		fmt.Fprintf(e.stderr, "%s is booting; `abox ssh %s` works once it is up (abox status %s shows when)\n", name, name, name)
		e.monitorAgentInBackground(m, name, w.timeout)
		return nil
	}
	fmt.Fprintf(e.stderr, "waiting for %s: ssh and cloud-init (up to %s)\n", name, w.timeout)
	b, err := m.WaitReady(cmd.Context(), name, w.timeout)
	if err != nil {
		return withHint(err, fmt.Sprintf("the guest keeps running: see its console with `tail -f %s | cat -v` (cat -v shows the guest's control bytes instead of sending them to the terminal), retry with a longer --timeout, or stop it with `abox stop --force %s`", m.Layout.Instance(name).SerialLog, name))
	}
	fmt.Fprintf(e.stderr, "%s is ready: ssh answered %s and cloud-init finished %s after start; connect with `abox ssh %s`\n",
		name, b.SSHAt.Sub(b.StartedAt).Round(100*time.Millisecond), b.ReadyAfter().Round(100*time.Millisecond), name)
	if len(b.Errors) > 0 {
		fmt.Fprintf(e.stderr, "warning: cloud-init reported errors in %s: %s\n", name, termtext.Clean(strings.Join(b.Errors, "; ")))
	}
	e.startMonitorAgent(cmd.Context(), m.Layout, name)
	return nil
}

func newStartCmd(e *env) *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "start NAME",
		Short: "Start an instance: network, host firewall, filters, then the guest; wait until it answers SSH",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			t0 := time.Now()
			if err := m.Start(cmd.Context(), args[0]); err != nil {
				return notFoundHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "started %s in %s\n", args[0], time.Since(t0).Round(time.Millisecond))
			return w.waitReady(cmd, e, m, args[0])
		},
	}
	addWaitFlags(cmd, &w, "timeout")
	return cmd
}

func newStopCmd(e *env) *cobra.Command {
	var o instance.StopOptions
	cmd := &cobra.Command{
		Use:   "stop NAME",
		Short: "Shut an instance down (ACPI), then stop its filters and network",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			if err := m.Stop(cmd.Context(), args[0], o); err != nil {
				return notFoundHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "stopped %s\n", args[0])
			return nil
		},
	}
	addStopFlags(cmd, &o)
	return cmd
}

// addStopFlags gives stop and restart the same shutdown options.
func addStopFlags(cmd *cobra.Command, o *instance.StopOptions) {
	cmd.Flags().BoolVar(&o.Force, "force", false, "power off at once instead of an ACPI shutdown")
	cmd.Flags().DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long to wait for the guest to shut down")
}

func newRestartCmd(e *env) *cobra.Command {
	var o instance.StopOptions
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "restart NAME",
		Short: "Stop then start an instance",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			if err := m.Stop(cmd.Context(), args[0], o); err != nil {
				return notFoundHint(args[0], err)
			}
			if err := m.Start(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "restarted %s\n", args[0])
			return w.waitReady(cmd, e, m, args[0])
		},
	}
	addStopFlags(cmd, &o)
	addWaitFlags(cmd, &w, "ready-timeout")
	return cmd
}

func newRemoveCmd(e *env) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:     "remove NAME",
		Aliases: []string{"rm"},
		Short:   "Delete an instance and everything abox made for it",
		Args:    exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			if err := m.Remove(cmd.Context(), args[0], force); err != nil {
				return notFoundHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "removed %s\n", args[0])
			return nil
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "power a running instance off and remove it")
	return cmd
}

func newListCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List instances",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.readManager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			infos, err := m.List(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if infos == nil {
					infos = []instance.Info{}
				}
				return writeJSON(e.stdout, infos)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATUS\tFILTERS\tGUEST IP\tSUBNET\tBASE\tCPUS\tMEMORY")
			for _, i := range infos {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d MiB\n", i.Name, i.Status, filtersState(i), i.GuestIP, i.Subnet, i.Base, i.CPUs, i.MemoryMiB)
			}
			return tw.Flush()
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func filtersState(i instance.Info) string {
	if i.Filters == "" {
		return instance.FiltersDown
	}
	return i.Filters
}

func newStatusCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "Show an instance's definition and live state",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.readManager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			i, err := m.Describe(cmd.Context(), args[0])
			if err != nil {
				return notFoundHint(args[0], err)
			}
			if asJSON {
				return writeJSON(e.stdout, i)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "name:\t%s\nstatus:\t%s\nfilters:\t%s\n", i.Name, i.Status, filtersState(i))
			fmt.Fprintf(tw, "guest:\t%s (user %s)\ngateway:\t%s (dns :53, proxy :%d)\nbridge:\t%s\nmac:\t%s\n", i.GuestIP, i.User, i.Gateway, i.ProxyPort, i.Bridge, i.MAC)
			fmt.Fprintf(tw, "base:\t%s\nresources:\t%d cpus, %d MiB, %d GiB disk, accel %s\ncreated:\t%s\n", i.Base, i.CPUs, i.MemoryMiB, i.DiskGiB, i.Accel, i.CreatedAt.Format(time.RFC3339))
			fmt.Fprintf(tw, "last boot:\t%s\n", describeBoot(i.LastBoot))
			if i.UpstreamProxy != "" {
				fmt.Fprintf(tw, "upstream proxy:\t%s\n", i.UpstreamProxy)
			}
			if a, err := e.access(); err == nil {
				fs, _ := a.Forwards(i.Name)
				for _, f := range fs {
					state := "stopped"
					if f.Active {
						state = "active"
					}
					fmt.Fprintf(tw, "forward:\t%s (%s)\n", f.Describe(), state)
				}
				ms, _ := a.Mounts(i.Name)
				for _, mt := range ms {
					fmt.Fprintf(tw, "mount:\t%s:%s on %s\n", i.Name, mt.GuestPath, mt.Dir)
				}
			}
			for _, w := range e.filterTrouble(cmd.Context(), i.Name) {
				fmt.Fprintf(tw, "warning:\t%s\n", w)
			}
			return tw.Flush()
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

// describeBoot renders the last boot for status.
func describeBoot(b instance.Boot) string {
	switch {
	case b.StartedAt.IsZero():
		return "never started"
	case b.ReadyAt.IsZero():
		return fmt.Sprintf("started %s, not seen ready (started without waiting, or still booting)", b.StartedAt.Format(time.RFC3339))
	}
	s := fmt.Sprintf("ready %s after start (ssh %s), started %s", b.ReadyAfter().Round(100*time.Millisecond), b.SSHAt.Sub(b.StartedAt).Round(100*time.Millisecond), b.StartedAt.Format(time.RFC3339))
	if len(b.Errors) > 0 {
		s += fmt.Sprintf("; cloud-init errors: %s", termtext.Clean(strings.Join(b.Errors, "; ")))
	}
	return s
}

func newSSHCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "ssh NAME [-- COMMAND...]",
		Short: "Open a shell (or run a command) in an instance over SSH",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			st, err := instance.Load(l, args[0])
			if err != nil {
				return notFoundHint(args[0], err)
			}
			argv, err := instance.SSHArgs(l, st, args[1:])
			if err != nil {
				return err
			}
			path, err := exec.LookPath("ssh")
			if err != nil {
				return withHint(errors.New("ssh is not installed"), "install openssh-client")
			}
			c := exec.CommandContext(cmd.Context(), path, argv...)
			c.Stdin, c.Stdout, c.Stderr = e.stdin, e.stdout, e.stderr
			if len(args) > 1 {
				// A command's output is the guest's and, without a tty of
				// its own, reaches the operator's terminal as bytes:
				// escaped there, passed as it is to a pipe or a file.
				for _, w := range []*io.Writer{&c.Stdout, &c.Stderr} {
					if termtext.IsTerminal(*w) {
						tw := termtext.NewWriter(*w)
						defer tw.Flush()
						*w = tw
					}
				}
			}
			if err := c.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return exitCodeError{code: ee.ExitCode()}
				}
				return err
			}
			return nil
		},
	}
}

// exitCodeError passes a child's exit status through without a message.
type exitCodeError struct{ code int }

func (e exitCodeError) Error() string { return "exit status " + strconv.Itoa(e.code) }

func notFoundHint(name string, err error) error {
	if errors.Is(err, instance.ErrNotFound) {
		return withHint(err, fmt.Sprintf("create it with `abox create %s`; `abox list` shows the existing ones", name))
	}
	return err
}

func newDaemonCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "daemon", Short: "Run an instance's filter daemon (used by abox start)", Hidden: true}
	run := &cobra.Command{
		Use:  "run NAME",
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			return instance.RunFilters(cmd.Context(), l, args[0], e.stderr, nil)
		},
	}
	supervise := &cobra.Command{
		Use:  "supervise NAME",
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			exe, err := executable()
			if err != nil {
				return err
			}
			// The guard watches the instance's host chains while the
			// supervisor runs, that is while the guest may run.
			gctx, stop := context.WithCancel(cmd.Context())
			defer stop()
			go runGuard(gctx, e, l, args[0])
			return instance.Supervise(cmd.Context(), l, exe, args[0], e.stderr)
		},
	}
	cmd.AddCommand(run, supervise)
	return cmd
}
