package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/explain"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/validate"
)

// exitBlocked is explain's status when the guest would be refused.
const exitBlocked = 3

func newExplainCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "explain NAME [METHOD] TARGET",
		Short: "Say whether the guest may reach a name or URL, by which rule and reason",
		Long: `Decide TARGET (a name, host:port or http(s) URL) as the instance's DNS filter
and proxy would: the rule that matches, the mode, and the reason code that
the filters' logs, the DNS Extended Error and the proxy's 403 carry. When the
host's allowlist entry has request rules, a URL is decided by them too, for
METHOD (default GET), with the proxy's own function on the path as written:
method_not_allowed, path_not_allowed or path_not_canonical, and the canonical
path the proxy would send. Nothing is sent to the target and the name is not
resolved: the addresses it resolves to are checked when the guest connects.

The live allowlist and mode come from the running filters; with the filters
down, from the allowlist file (a filter always starts in active mode).
Exit status: 0 allowed, 3 refused, 1 on error.`,
		Example: `  abox explain dev github.com
  abox explain dev https://api.example.com:8443/v1
  abox explain dev POST https://api.github.com/repos/acme/app/pulls
  abox explain dev 169.254.169.254`,
		Args: rangeArgs(2, 3, "an instance NAME, an optional METHOD and a TARGET"),
		RunE: func(cmd *cobra.Command, args []string) error {
			method, target := "", args[len(args)-1]
			if len(args) == 2 && slices.Contains([]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}, target) {
				return usageError{fmt.Errorf("%q reads as a method without a TARGET: give the URL after it (abox explain %s %s https://HOST/PATH)", target, args[0], target)}
			}
			if len(args) == 3 {
				method = args[1]
				if err := explain.Method(method); err != nil {
					return usageError{err}
				}
			}
			p, err := e.explainPolicy(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			r, err := explain.Explain(p, method, target)
			if err != nil {
				return usageError{err}
			}
			if asJSON {
				if err := writeJSON(e.stdout, r); err != nil {
					return err
				}
			} else {
				renderExplain(e, args[0], r)
			}
			if r.Verdict != allowlist.Allow {
				return exitCodeError{code: exitBlocked}
			}
			return nil
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

// explainPolicy gathers what the instance's filters decide with: the live
// allowlist and mode through the API, else the file and active mode.
func (e *env) explainPolicy(ctx context.Context, name string) (explain.Policy, error) {
	if err := validate.InstanceName(name); err != nil {
		return explain.Policy{}, usageError{err}
	}
	l, err := e.layout()
	if err != nil {
		return explain.Policy{}, err
	}
	st, err := instance.Load(l, name)
	if err != nil {
		return explain.Policy{}, notFoundHint(name, err)
	}
	host, err := netclass.HostAddrs()
	if err != nil {
		return explain.Policy{}, err
	}
	p := explain.Policy{
		Addresses: netclass.NewPolicy(st.AllowPrivate, append(host, st.Gateway)),
		Ports:     st.Ports, NoMITM: st.NoMITM, MITMExceptions: st.MITMExceptions,
	}
	c := api.NewClient(l.APISocket(name))
	entries, err := c.Allowlist(ctx)
	if err == nil {
		var mode policy.Mode
		if mode, err = c.Mode(ctx); err == nil {
			p.Mode, p.Source = mode, "the running filters"
			// lines carries every rule; filters older than rules send
			// names only, which are then the whole list.
			lines := entries.Lines
			if lines == nil {
				lines = entries.Entries
			}
			p.List, err = listOf(lines)
			return p, err
		}
	}
	if !errors.Is(err, api.ErrNotRunning) {
		return explain.Policy{}, fmt.Errorf("instance %s: asking the filters: %w", name, err)
	}
	f, err := os.Open(l.Instance(name).Allowlist)
	if err != nil {
		return explain.Policy{}, fmt.Errorf("instance %s: reading the allowlist: %w", name, err)
	}
	defer f.Close()
	if p.List, err = allowlist.Parse(f, f.Name()); err != nil {
		return explain.Policy{}, fmt.Errorf("instance %s: %w", name, err)
	}
	p.Mode, p.Source = policy.Active, "the allowlist file (filters not running; they start active)"
	return p, nil
}

// rangeArgs is cobra.RangeArgs with an error that names what is expected.
func rangeArgs(lo, hi int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < lo || len(args) > hi {
			return usageError{fmt.Errorf("%s takes %s (got %d arguments; see --help)", cmd.CommandPath(), names, len(args))}
		}
		return nil
	}
}

// listOf builds the list the filters reported, a line each: a name, or a
// name with one of its request rules.
func listOf(entries []string) (*allowlist.List, error) {
	lines := make([]allowlist.Line, 0, len(entries))
	for _, s := range entries {
		ln, err := allowlist.ParseLine(s)
		if err != nil {
			return nil, fmt.Errorf("the filters listed an entry abox cannot parse: %w", err)
		}
		lines = append(lines, ln)
	}
	return allowlist.NewLines(lines)
}

func renderExplain(e *env, name string, r explain.Result) {
	fmt.Fprintf(e.stdout, "%s (%s, port %d) from instance %s, mode %s, per %s\n", r.Host, r.Scheme, r.Port, name, r.Mode, r.Source)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	row := func(layer string, s explain.Step) {
		if s.Verdict == "" {
			fmt.Fprintf(tw, "  %s\t-\t\t\t%s\n", layer, s.Detail)
			return
		}
		rule := "-"
		if s.Rule != "" {
			rule = "rule " + s.Rule
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", layer, s.Verdict, s.Reason, rule, s.Detail)
	}
	row("dns", r.DNS)
	row("proxy", r.Proxy)
	tw.Flush()
	if q := r.Request; q != nil {
		switch {
		case q.Decision == nil:
			fmt.Fprintf(e.stdout, "  request rules of %s: %s\n    %s\n", q.Set, q.Rules, q.Note)
		case q.Allowed:
			sent := q.Path
			if q.Query != "" {
				sent += "?" + q.Query
			}
			rule := q.Rule
			if rule == "" {
				rule = "(everything)"
			}
			fmt.Fprintf(e.stdout, "  request: %s allowed by %s's rule %q, sent upstream as %s\n", q.Method, q.Set, rule, sent)
			if q.WouldDeny != "" {
				fmt.Fprintf(e.stdout, "    audit: the other rules would refuse it (would_deny %s)\n", q.WouldDeny)
			}
		default:
			fmt.Fprintf(e.stdout, "  request: %s refused, %s, by the rules of %s: %s\n", q.Method, q.Reason, q.Set, q.Rules)
			if q.Detail != "" {
				fmt.Fprintf(e.stdout, "    %s\n", q.Detail)
			}
		}
	}
	if p := r.Push; p != nil {
		fmt.Fprintf(e.stdout, "  push rules of %s: push %s\n    %s\n", p.Set, p.Rules, p.Note)
	}
	if r.TLS != "" {
		fmt.Fprintf(e.stdout, "  tls: %s\n", r.TLS)
	}
	verdict := strings.ToUpper(string(r.Verdict))
	fmt.Fprintf(e.stdout, "%s (nothing was sent to %s)\n", verdict, r.Host)
}
