package cli

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

func newSnapshotCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "snapshot",
		Aliases: []string{"snap"},
		Short:   "Take, list, revert to and remove snapshots of an instance's guest",
		Long: `A snapshot holds the guest only: its disk and, when taken while the guest runs,
its memory, so a revert resumes the guest where it was. The instance's host side
(allowlist, filter settings, packet filter, host chains, filter daemon, CA, SSH
host key pin) is not in a snapshot: a revert keeps it as it is now.

Snapshots are qcow2 internal snapshots inside the instance's disk overlay; the
shared base image is never written. abox remove removes them with the instance.
See docs/snapshots.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError{fmt.Errorf("%s needs a subcommand: create, list, revert or remove (see --help)", cmd.CommandPath())}
		},
	}
	cmd.AddCommand(newSnapshotCreateCmd(e), newSnapshotListCmd(e), newSnapshotRevertCmd(e), newSnapshotRemoveCmd(e))
	return cmd
}

// snapshotArgs checks NAME and the snapshot names in args[1:].
func snapshotArgs(min, max int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || (max >= 0 && len(args) > max) {
			return usageError{fmt.Errorf("%s takes %s (got %d arguments; see --help)", cmd.CommandPath(), names, len(args))}
		}
		if err := validate.InstanceName(args[0]); err != nil {
			return usageError{err}
		}
		for _, s := range args[1:] {
			if err := validate.SnapshotName(s); err != nil {
				return usageError{err}
			}
		}
		return nil
	}
}

func snapshotHint(name string, err error) error {
	if errors.Is(err, instance.ErrSnapshotNotFound) {
		return withHint(err, fmt.Sprintf("`abox snapshot list %s` shows its snapshots", name))
	}
	return notFoundHint(name, err)
}

func newSnapshotCreateCmd(e *env) *cobra.Command {
	var description string
	cmd := &cobra.Command{
		Use:   "create NAME [SNAPSHOT]",
		Short: "Take a snapshot of an instance's guest, running or stopped",
		Long: `Take a snapshot of the guest of instance NAME. Of a running guest it keeps the
memory too (the guest is paused while it is written, seconds per GiB of memory);
of a stopped one, the disk. SNAPSHOT defaults to the UTC time, such as
` + time.Date(2026, 12, 2, 15, 4, 5, 0, time.UTC).Format(instance.SnapshotTimeFormat) + `.`,
		Example: `  abox snapshot create dev before-upgrade --description "clean checkout, deps installed"
  abox snapshot create dev`,
		Args: snapshotArgs(1, 2, "an instance NAME and an optional SNAPSHOT name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			snap := ""
			if len(args) == 2 {
				snap = args[1]
			}
			if err := libvirt.SnapshotDescription(description); err != nil {
				return usageError{err}
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			t0 := time.Now()
			s, err := m.CreateSnapshot(cmd.Context(), args[0], snap, description)
			if err != nil {
				return snapshotHint(args[0], err)
			}
			what := "disk"
			if s.Memory() {
				what = "memory and disk"
			}
			fmt.Fprintf(e.stderr, "took snapshot %s of %s (%s, %s, in %s); revert with `abox snapshot revert %s %s`\n",
				s.Name, args[0], s.State, what, time.Since(t0).Round(100*time.Millisecond), args[0], s.Name)
			fmt.Fprintln(e.stdout, s.Name)
			return nil
		},
	}
	cmd.Flags().StringVarP(&description, "description", "d", "", "one line saying what the snapshot holds")
	return cmd
}

func newSnapshotListCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list NAME",
		Aliases: []string{"ls"},
		Short:   "List an instance's snapshots, oldest first",
		Long: `List the snapshots of instance NAME, oldest first: when each was taken, the
guest's state then (a running one holds memory, and a revert resumes it), the
size of the memory saved, and which is current (the last taken or reverted to).`,
		Args: snapshotArgs(1, 1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			list, err := m.Snapshots(cmd.Context(), args[0])
			if err != nil {
				return snapshotHint(args[0], err)
			}
			if asJSON {
				return writeJSON(e.stdout, list)
			}
			return renderSnapshots(e.stdout, list)
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func renderSnapshots(w io.Writer, list []instance.SnapshotInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED\tSTATE\tMEMORY\tCURRENT\tDESCRIPTION")
	for _, s := range list {
		mem, cur := "-", ""
		if s.MemoryBytes > 0 {
			mem = fmt.Sprintf("%d MiB", (s.MemoryBytes+1<<20-1)>>20)
		}
		if s.Current {
			cur = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Created.Local().Format("2006-01-02 15:04:05"), s.State, mem, cur, termtext.Clean(s.Description))
	}
	return tw.Flush()
}

func newSnapshotRevertCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "revert NAME SNAPSHOT",
		Short: "Put an instance's guest back to a snapshot",
		Long: `Put the guest of instance NAME back to SNAPSHOT; what happens to it depends on
the snapshot:

  taken while running   the guest resumes as it was then (processes, memory,
                        disk). A running guest is replaced in place (its SSH
                        sessions, mounts and forwards end; forwards come back);
                        a stopped instance is started first, filters before guest.
  taken while stopped   the disk is put back and the instance is stopped. A
                        running guest is powered off, not shut down: what it had
                        not written to disk is lost.

Anything since the snapshot is lost unless you take a snapshot first. The host
side stays as it is now: a revert never brings back an older allowlist, filter
setting or packet filter.`,
		Example: `  abox snapshot revert dev before-upgrade`,
		Args:    snapshotArgs(2, 2, "an instance NAME and a SNAPSHOT name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			t0 := time.Now()
			res, err := m.RevertSnapshot(cmd.Context(), args[0], args[1])
			if err != nil {
				return snapshotHint(args[0], err)
			}
			took := time.Since(t0).Round(100 * time.Millisecond)
			if res.After.Active() {
				fmt.Fprintf(e.stderr, "reverted %s to %s in %s: the guest runs as it was at %s\n", args[0], args[1], took, res.Snapshot.Created.Local().Format(time.DateTime))
			} else {
				fmt.Fprintf(e.stderr, "reverted %s to %s in %s: its disk is as it was at %s and the instance is stopped; start it with `abox start %s`\n", args[0], args[1], took, res.Snapshot.Created.Local().Format(time.DateTime), args[0])
			}
			return nil
		},
	}
	return cmd
}

func newSnapshotRemoveCmd(e *env) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:     "remove NAME SNAPSHOT... | NAME --all",
		Aliases: []string{"rm"},
		Short:   "Remove snapshots of an instance",
		Long: `Remove the named snapshots of instance NAME (or all of them with --all) and the
data they keep in its disk overlay. Snapshots taken after a removed one stay.
Every name must exist, or nothing is removed.`,
		Example: `  abox snapshot remove dev before-upgrade
  abox snapshot remove dev --all`,
		Args: snapshotArgs(1, -1, "an instance NAME and SNAPSHOT names (or --all)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 1) {
				return usageError{fmt.Errorf("%s takes either SNAPSHOT names or --all (see --help)", cmd.CommandPath())}
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			removed, err := m.RemoveSnapshots(cmd.Context(), args[0], args[1:], all)
			for _, s := range removed {
				fmt.Fprintf(e.stderr, "removed snapshot %s of %s\n", s, args[0])
			}
			if err != nil {
				return snapshotHint(args[0], err)
			}
			if len(removed) == 0 {
				fmt.Fprintf(e.stderr, "%s has no snapshots\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every snapshot of the instance")
	return cmd
}
