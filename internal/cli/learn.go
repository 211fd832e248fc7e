package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/project"
	"github.com/abox-dev/abox/internal/propose"
	"github.com/abox-dev/abox/internal/termtext"
)

// newLearnCmds returns `net learn` (start, stop, show, clear) and `net
// propose`, which turns what learn mode recorded into allowlist lines.
func newLearnCmds(e *env) []*cobra.Command {
	learn := &cobra.Command{
		Use:   "learn",
		Short: "Record what a workload does, to propose allowlist lines with rules",
		Long: `Learn mode allows names that are not allowlisted, as passive mode does, and
records every request the proxy sees: host, port, method, path (never the
query, headers or bodies) and status. Everything else active mode refuses
stays refused: IP literals, private, loopback and metadata addresses,
special-use names, rebinding. Request rules are recorded, not enforced.
abox net propose then turns the record into allowlist lines.

The guest can still send what it holds to any public name while learning:
learn with a workload you would trust in passive mode. A restarted filter
comes back active, and the record is lost with it.`,
		// "abox net learn dev" reads as a command; say which verb it lacks.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usageError{fmt.Errorf("%q is not a verb of abox net learn: use start, stop, show or clear, as in abox net learn start %s", args[0], args[0])}
		},
	}
	var reset bool
	start := &cobra.Command{
		Use:   "start NAME",
		Short: "Put the instance's filters in learn mode",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			if reset {
				if err := c.ClearLearned(cmd.Context()); err != nil {
					return err
				}
			}
			if err := c.SetMode(cmd.Context(), policy.Learn); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s: learning: names not on the allowlist are allowed and every request is recorded; IP literals, private addresses and special-use names stay refused\n", name)
			fmt.Fprintf(e.stderr, "run the workload, then: abox net propose %s (and abox net learn stop %s)\n", name, name)
			return nil
		}),
	}
	start.Flags().BoolVar(&reset, "reset", false, "forget what an earlier learning session recorded first")
	stop := &cobra.Command{
		Use:   "stop NAME",
		Short: "End learn mode: the filters enforce the allowlist again (the record stays)",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			m, err := c.Mode(cmd.Context())
			if err != nil {
				return err
			}
			if m != policy.Learn {
				return withHint(fmt.Errorf("instance %s is not learning (its filters are %s); nothing changed", name, m),
					fmt.Sprintf("abox net filter %s active sets active mode", name))
			}
			if err := c.SetMode(cmd.Context(), policy.Active); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s: filter mode active; the record stays for abox net propose %s\n", name, name)
			return nil
		}),
	}
	var showJSON bool
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "List what learn mode recorded",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			rec, err := c.Learned(cmd.Context())
			if err != nil {
				return err
			}
			if showJSON {
				return writeJSON(e.stdout, rec)
			}
			renderLearned(e, rec)
			return nil
		}),
	}
	jsonFlag(show.Flags(), &showJSON, "")
	clear := &cobra.Command{
		Use:   "clear NAME",
		Short: "Forget what learn mode recorded",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			if err := c.ClearLearned(cmd.Context()); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s: learning record cleared\n", name)
			return nil
		}),
	}
	learn.AddCommand(start, stop, show, clear)
	return []*cobra.Command{learn, newProposeCmd(e)}
}

// renderLearned prints the record: paths and names are the guest's, so
// they go through termtext.
func renderLearned(e *env, rec policy.LearnSnapshot) {
	tw := tabwriter.NewWriter(termtext.NewWriter(e.stdout), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tMETHOD\tPATH\tSTATUS\tCOUNT\tWRITE")
	for _, h := range rec.Hosts {
		if h.Tunnel {
			fmt.Fprintf(tw, "%s\tCONNECT\t(tunnelled unseen)\t\t%d\t?\n", h.Host, h.Connects)
		}
		for _, q := range h.Requests {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%v\n", h.Host, q.Method, q.Path, q.Status, q.Count, q.Write)
		}
		if h.Dropped > 0 {
			fmt.Fprintf(tw, "%s\t%s\t(not recorded: bound reached)\t\t%d\t\n", h.Host, strings.Join(h.DroppedMethods, ","), h.Dropped)
		}
	}
	tw.Flush()
	if !rec.Since.IsZero() {
		fmt.Fprintf(e.stderr, "recorded since %s\n", rec.Since.UTC().Format(time.RFC3339))
	}
	if rec.DroppedHosts > 0 {
		fmt.Fprintf(e.stderr, "%d requests to further hosts were not recorded (limit %d hosts)\n", rec.DroppedHosts, rec.Limits.Hosts)
	}
}

// proposeResult is propose --json's output.
type proposeResult struct {
	Instance string         `json:"instance"`
	Path     string         `json:"path"`
	Lines    []propose.Line `json:"lines"`
	Notes    []string       `json:"notes,omitempty"`
	Diff     string         `json:"diff"`
	Applied  bool           `json:"applied"`
	Since    time.Time      `json:"since,omitzero"`
	Record   *recordSummary `json:"record"`
}

type recordSummary struct {
	Hosts    int    `json:"hosts"`
	Requests uint64 `json:"requests"`
}

func newProposeCmd(e *env) *cobra.Command {
	var apply, asJSON bool
	cmd := &cobra.Command{
		Use:   "propose NAME",
		Short: "Propose allowlist lines, with rules, that allow what learn mode recorded",
		Long: `Prints, as a diff against the allowlist in force, the smallest lines that would
have allowed every request learn mode recorded: exact names unless four or
more names below one registrable domain were seen, methods per host, paths
collapsed to patterns. Lines that let the guest send data out (a write
method, an upload path) or allow more than was seen (a wildcard, a tunnel,
a ** pattern) are preceded by a "# review:" comment saying why.

--apply (-w) appends the lines to the instance's allowlist through the same
checked edit as abox allowlist edit. An instance made by abox up keeps its
allowlist to its abox.yaml, so for one --apply refuses and the lines belong
in that file, where abox trust reviews them as a widening.`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			c, err := e.apiClient(name)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			rec, err := c.Learned(ctx)
			if err != nil {
				return notRunningHint(name, err)
			}
			cur, err := c.AllowlistText(ctx)
			if err != nil {
				return notRunningHint(name, err)
			}
			list, err := allowlist.Parse(strings.NewReader(cur.Text), cur.Path)
			if err != nil {
				return fmt.Errorf("reading the allowlist in force: %w", err)
			}
			p := propose.Propose(rec, list, propose.Options{})
			if !rec.Since.IsZero() {
				p.Header = fmt.Sprintf("proposed by abox net propose from what %s did in learn mode since %s", name, rec.Since.UTC().Format(time.RFC3339))
			}
			diff := p.Diff(cur.Path, cur.Text)
			res := proposeResult{Instance: name, Path: cur.Path, Lines: p.Lines, Notes: p.Notes, Diff: diff, Since: rec.Since, Record: summarise(rec)}
			if res.Lines == nil {
				res.Lines = []propose.Line{}
			}
			if apply && len(p.Lines) > 0 {
				if err := applyProposal(ctx, e, c, name, cur, p); err != nil {
					if asJSON {
						writeJSON(e.stdout, res)
					} else {
						fmt.Fprint(termtext.NewWriter(e.stdout), diff)
					}
					return err
				}
				res.Applied = true
			}
			if asJSON {
				return writeJSON(e.stdout, res)
			}
			tw := termtext.NewWriter(e.stderr)
			for _, n := range p.Notes {
				fmt.Fprintf(tw, "note: %s\n", n)
			}
			tw.Flush()
			if len(p.Lines) == 0 {
				if len(rec.Hosts) == 0 {
					fmt.Fprintf(e.stderr, "nothing to propose: the learning record of %s is empty (start it with abox net learn start %s, then run the workload)\n", name, name)
				} else {
					fmt.Fprintf(e.stderr, "nothing to propose: the allowlist in force allows everything recorded\n")
				}
				return nil
			}
			out := termtext.NewWriter(e.stdout)
			fmt.Fprint(out, diff)
			out.Flush()
			if res.Applied {
				fmt.Fprintf(e.stderr, "applied %d lines to %s\n", len(p.Lines), cur.Path)
				if m, err := c.Mode(ctx); err == nil && m == policy.Learn {
					fmt.Fprintf(e.stderr, "%s is still learning: abox net learn stop %s enforces the allowlist\n", name, name)
				}
			} else {
				fmt.Fprintf(e.stderr, "review the lines, then apply them with abox net propose %s --apply\n", name)
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&apply, "apply", "w", false, "append the proposed lines to the instance's allowlist")
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func summarise(rec policy.LearnSnapshot) *recordSummary {
	s := &recordSummary{Hosts: len(rec.Hosts)}
	for _, h := range rec.Hosts {
		for _, q := range h.Requests {
			s.Requests += q.Count
		}
	}
	return s
}

// applyProposal puts the proposal in force through the allowlist's
// checked replace (the edit path of abox allowlist edit): refused if the
// list changed since it was read, validated by the filters, saved by them.
func applyProposal(ctx context.Context, e *env, c *api.Client, name string, cur api.TextBody, p propose.Proposal) error {
	l, err := e.layout()
	if err != nil {
		return err
	}
	file, bound, err := project.BoundFile(l, name)
	if err != nil {
		return err
	}
	if bound {
		return withHint(fmt.Errorf("not applied: instance %s was made by abox up from %s, which keeps its allowlist to the file's", name, file),
			fmt.Sprintf("add the proposed lines to the allowlist of %s, then run abox trust and abox up", file))
	}
	_, err = c.ReplaceAllowlist(ctx, cur.Text, p.Apply(cur.Text))
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == http.StatusConflict {
		return withHint(errors.New("not applied: the allowlist changed while the proposal was made"), fmt.Sprintf("run abox net propose %s --apply again", name))
	}
	if err != nil {
		return fmt.Errorf("applying the proposal: %w", err)
	}
	return nil
}
