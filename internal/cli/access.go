package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

// access is the guest-access side of the environment.
func (e *env) access() (guest.Access, error) {
	l, err := e.layout()
	if err != nil {
		return guest.Access{}, err
	}
	exe, err := executable()
	if err != nil {
		return guest.Access{}, err
	}
	return guest.Access{Layout: l, Exe: exe, Progress: e.stderr}, nil
}

func (e *env) target(name string) (guest.Target, error) {
	l, err := e.layout()
	if err != nil {
		return guest.Target{}, err
	}
	t, err := guest.Load(l, name)
	if err != nil {
		return guest.Target{}, notFoundHint(name, err)
	}
	return t, nil
}

func newSCPCmd(e *env) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   "scp [-r] SOURCE... DEST",
		Short: "Copy files between the host and an instance (NAME:PATH on one side)",
		Long: `Copy files between the host and an instance over its SSH connection (pinned
host key, no agent or forwarding). Write a guest path as NAME:PATH, relative to
the login user's home unless absolute; write a host path holding a colon as
./a:b. A host path is never used through a symbolic link: one on the way
(a trailing slash after one included) is refused, and so is a host source
that is a link out of its directory, or a tree holding one that leads out
of it (scp would follow it); files from the guest arrive through a staging
directory and never through a symbolic link at the destination.`,
		Example: `  abox scp -r ./src dev:work/
  abox scp dev:work/report.txt .`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var p guest.CopyPlan
			p.Recursive = recursive
			for i, a := range args {
				loc, err := guest.ParseLocation(a)
				if err != nil {
					return usageError{err}
				}
				if i == len(args)-1 {
					p.Dest = loc
				} else {
					p.Sources = append(p.Sources, loc)
				}
			}
			name, err := p.Instance()
			if err != nil {
				return usageError{err}
			}
			t, err := e.target(name)
			if err != nil {
				return err
			}
			return guest.Copy(cmd.Context(), t, p, e.stdout, e.stderr)
		},
	}
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "copy directories recursively")
	return cmd
}

func newProvisionCmd(e *env) *cobra.Command {
	var scripts []string
	var overlay string
	cmd := &cobra.Command{
		Use:   "provision NAME -s SCRIPT [-s SCRIPT...] [--overlay DIR[:GUESTDIR]]",
		Short: "Copy an overlay into a running instance and run scripts in it as root",
		Long: `Provision a running instance: first the overlay directory is copied into the
guest's file system (its root, or GUESTDIR), owned by root; then every script
runs as root in /, in order, with the proxy and CA environment of the guest's
shells and its stdin closed. Output streams as it comes, with escape sequences
and other control characters shown escaped (the guest writes it). The first
script that fails stops the run, and abox exits with that script's status.

What the scripts download must be on the allowlist: provisioning goes through
the filters like everything else the guest does. Overlays hold regular files
and directories only (a symbolic link is refused), at most 512 MiB.`,
		Example: `  abox provision dev -s setup.sh -s install-agent.sh
  abox provision dev --overlay ./overlay -s setup.sh`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(scripts) == 0 && overlay == "" {
				return usageError{errors.New("provision needs at least one -s SCRIPT or an --overlay DIR")}
			}
			t, err := e.target(args[0])
			if err != nil {
				return err
			}
			var p guest.Plan
			if overlay != "" {
				dir, target := overlay, ""
				if i := strings.LastIndex(overlay, ":"); i > 0 && strings.HasPrefix(overlay[i+1:], "/") {
					dir, target = overlay[:i], overlay[i+1:]
				}
				o, root, err := guest.OpenOverlay(dir, target)
				if err != nil {
					return err
				}
				defer root.Close()
				p.Overlay = o
			}
			for _, s := range scripts {
				// The script's directory is reached without a symbolic
				// link: a repository's `scripts -> ~/.ssh` would send a
				// host file of that name to the guest.
				root, err := fsutil.OpenRootNoLinks(filepath.Dir(s))
				if err != nil {
					return fmt.Errorf("reading script %s: %w", termtext.Clean(s), err)
				}
				sc, err := guest.ReadScript(root, filepath.Base(s))
				root.Close()
				if err != nil {
					return err
				}
				sc.Name = s
				p.Scripts = append(p.Scripts, sc)
			}
			if err := guest.Provision(cmd.Context(), t, p, e.stdout, e.stderr); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "provisioned %s\n", t.Name())
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&scripts, "script", "s", nil, "host SCRIPT to run as root in the guest, repeatable (in order)")
	cmd.Flags().StringVar(&overlay, "overlay", "", "host DIR copied into the guest's / (or DIR:/GUESTDIR) before the scripts")
	return cmd
}

func newForwardCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "forward",
		Short: "Forward host loopback ports to an instance over SSH",
		Long: `A forward listens on the host's 127.0.0.1 only and reaches the guest's
127.0.0.1:GUESTPORT through the instance's SSH connection, so the packet filter
keeps every other port closed. Forwards are recorded per instance: they stop
with the instance and come back when it starts. Any local user of the host can
connect to a forwarded port.

A reverse forward (--reverse) offers a host service to the guest. It bypasses
the DNS and HTTP filters and the packet filter, so it is refused unless asked
for with --reverse, and every start warns about it.`,
	}
	var reverse bool
	add := &cobra.Command{
		Use:     "add NAME HOSTPORT:GUESTPORT",
		Short:   "Forward host 127.0.0.1:HOSTPORT to the guest's GUESTPORT",
		Example: "  abox forward add dev 8080:80\n  abox forward add dev 9000:9000 --reverse   # guest 127.0.0.1:9000 reaches host 127.0.0.1:9000, unfiltered",
		Args:    exactArgs(2, "an instance NAME and HOSTPORT:GUESTPORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := guest.ParseForward(args[1], reverse)
			if err != nil {
				return usageError{err}
			}
			t, err := e.target(args[0])
			if err != nil {
				return err
			}
			m, closeFn, err := e.readManager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			info, err := m.Describe(cmd.Context(), t.Name())
			if err != nil {
				return err
			}
			a, err := e.access()
			if err != nil {
				return err
			}
			running := info.Status == "running"
			if err := a.AddForward(cmd.Context(), t, f, running); err != nil {
				return err
			}
			if running {
				fmt.Fprintf(e.stderr, "forwarding %s\n", f.Describe())
			} else {
				fmt.Fprintf(e.stderr, "recorded %s; it starts with `abox start %s`\n", f.Describe(), t.Name())
			}
			return nil
		},
	}
	add.Flags().BoolVar(&reverse, "reverse", false, "offer host 127.0.0.1:HOSTPORT to the guest on its GUESTPORT (bypasses every filter)")
	var removeReverse bool
	remove := &cobra.Command{
		Use:     "remove NAME HOSTPORT:GUESTPORT",
		Aliases: []string{"rm"},
		Short:   "Stop a forward and forget it",
		Args:    exactArgs(2, "an instance NAME and HOSTPORT:GUESTPORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := guest.ParseForward(args[1], removeReverse)
			if err != nil {
				return usageError{err}
			}
			if err := validate.InstanceName(args[0]); err != nil {
				return usageError{err}
			}
			a, err := e.access()
			if err != nil {
				return err
			}
			if err := a.RemoveForward(cmd.Context(), args[0], f); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "removed forward %s of %s\n", f, args[0])
			return nil
		},
	}
	remove.Flags().BoolVar(&removeReverse, "reverse", false, "the forward is a reverse one")
	var asJSON bool
	list := &cobra.Command{
		Use:     "list NAME",
		Aliases: []string{"ls"},
		Short:   "List an instance's forwards",
		Args:    exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.target(args[0]); err != nil {
				return err
			}
			a, err := e.access()
			if err != nil {
				return err
			}
			fs, err := a.Forwards(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, fs)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FORWARD\tSTATE\tWHAT")
			for _, f := range fs {
				state := "stopped"
				if f.Active {
					state = "active"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", f.Forward, state, f.Describe())
			}
			return tw.Flush()
		},
	}
	jsonFlag(list.Flags(), &asJSON, "")
	var runReverse bool
	run := &cobra.Command{
		Use:    "run NAME HOSTPORT:GUESTPORT",
		Short:  "Carry one forward (started by abox start and forward add)",
		Hidden: true,
		Args:   exactArgs(2, "an instance NAME and HOSTPORT:GUESTPORT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := guest.ParseForward(args[1], runReverse)
			if err != nil {
				return usageError{err}
			}
			t, err := e.target(args[0])
			if err != nil {
				return err
			}
			return guest.RunForward(cmd.Context(), t, f, e.stderr)
		},
	}
	run.Flags().BoolVar(&runReverse, "reverse", false, "")
	cmd.AddCommand(add, remove, list, run)
	return cmd
}

func newMountCmd(e *env) *cobra.Command {
	var readOnly bool
	cmd := &cobra.Command{
		Use:   "mount NAME[:PATH] DIR",
		Short: "Mount a guest directory on the host (sshfs)",
		Long: `Mount the guest's PATH (the login user's home by default; relative paths are
under it) on the empty host directory DIR with sshfs over the instance's SSH
connection; DIR is reached through no symbolic link. The host reads the guest's files; the guest gets no path into the
host: symbolic links are resolved inside the guest, and set-uid bits, device
nodes and executables from the guest are inert on the host (nosuid, nodev,
noexec). Mounts end when the instance stops or is removed.`,
		Example: "  abox mount dev:work ./work\n  abox mount dev /mnt/dev-home --read-only",
		Args:    exactArgs(2, "NAME[:PATH] and a host DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, path, _ := strings.Cut(args[0], ":")
			if err := validate.InstanceName(name); err != nil {
				return usageError{err}
			}
			t, err := e.target(name)
			if err != nil {
				return err
			}
			a, err := e.access()
			if err != nil {
				return err
			}
			m := guest.Mount{Dir: args[1], GuestPath: path, ReadOnly: readOnly}
			if err := a.Mount(cmd.Context(), t, m); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "mounted %s:%s on %s; unmount with `abox unmount %s`\n", name, path, args[1], args[1])
			return nil
		},
	}
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "mount read-only")
	return cmd
}

func newUnmountCmd(e *env) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:     "unmount DIR|NAME",
		Aliases: []string{"umount"},
		Short:   "Unmount an abox mount, or every mount of an instance",
		Args: func(cmd *cobra.Command, args []string) error {
			if all && len(args) == 0 {
				return nil
			}
			return exactArgs(1, "a mount DIR or an instance NAME (or --all)")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			a, err := e.access()
			if err != nil {
				return err
			}
			var names []string
			switch {
			case len(args) == 0:
				sts, err := instance.ListStates(a.Layout)
				if err != nil {
					return err
				}
				for _, st := range sts {
					names = append(names, st.Name)
				}
			default:
				if fi, err := os.Stat(args[0]); err == nil && fi.IsDir() {
					m, name, err := a.Unmount(cmd.Context(), args[0])
					if err != nil {
						return err
					}
					fmt.Fprintf(e.stderr, "unmounted %s (%s:%s)\n", m.Dir, name, m.GuestPath)
					return nil
				}
				if _, err := e.target(args[0]); err != nil {
					return withHint(fmt.Errorf("unmounting %s: neither a directory nor an instance", args[0]), "`abox unmount DIR`, `abox unmount NAME` or `abox unmount --all`")
				}
				names = []string{args[0]}
			}
			var errs []error
			for _, n := range names {
				ms, err := a.UnmountInstance(cmd.Context(), n)
				for _, m := range ms {
					fmt.Fprintf(e.stderr, "unmounted %s (%s:%s)\n", m.Dir, n, m.GuestPath)
				}
				if err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "unmount every abox mount")
	return cmd
}
