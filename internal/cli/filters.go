package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

// apiClient returns a client for the named instance's API socket.
func (e *env) apiClient(name string) (*api.Client, error) {
	if err := validate.InstanceName(name); err != nil {
		return nil, usageError{err}
	}
	l, err := e.layout()
	if err != nil {
		return nil, err
	}
	return api.NewClient(l.APISocket(name)), nil
}

// notRunningHint turns "nothing on the socket" into advice.
// apiRun is the RunE of a command on the running filters of the instance
// its first argument names: run gets that instance's API client, and an
// error saying the filters are not running gets the hint to start them.
func apiRun(e *env, run func(cmd *cobra.Command, c *api.Client, name string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := e.apiClient(args[0])
		if err != nil {
			return err
		}
		return notRunningHint(args[0], run(cmd, c, args[0]))
	}
}

func notRunningHint(name string, err error) error {
	if errors.Is(err, api.ErrNotRunning) {
		return withHint(fmt.Errorf("instance %s: %w", name, err), fmt.Sprintf("start it with `abox start %s` (or run `abox dns serve --name %s` for a standalone filter)", name, name))
	}
	return err
}

func newDNSCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "dns", Short: "Inspect and run the DNS filter"}
	cmd.AddCommand(newComponentStatusCmd(e, "dns"), newComponentLogsCmd(e, "dns"), newDNSServeCmd(e))
	return cmd
}

func newHTTPCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "http", Short: "Inspect and run the HTTP/HTTPS filtering proxy"}
	cmd.AddCommand(newComponentStatusCmd(e, "http"), newComponentLogsCmd(e, "http"), newHTTPServeCmd(e))
	return cmd
}

func newComponentStatusCmd(e *env, component string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: fmt.Sprintf("Show the %s filter's mode, allowlist and counters", component),
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			stats, ok := st.Components[component]
			if !ok {
				return fmt.Errorf("instance %s runs no %s filter", name, component)
			}
			if asJSON {
				return writeJSON(e.stdout, map[string]any{
					"instance": st.Instance, "mode": st.Mode, "allowlist": st.Allowlist, component: stats,
				})
			}
			renderStatus(e.stdout, st, component, stats)
			return nil
		}),
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func renderStatus(w io.Writer, st api.Status, component string, stats any) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "instance:\t%s\n", st.Instance)
	fmt.Fprintf(tw, "filter:\t%s\n", component)
	fmt.Fprintf(tw, "mode:\t%s\n", st.Mode)
	fmt.Fprintf(tw, "allowlist:\t%s (%d entries, loaded %s)\n", st.Allowlist.Path, st.Allowlist.Entries, st.Allowlist.LoadedAt.Format(time.RFC3339))
	if st.Allowlist.LastError != "" {
		fmt.Fprintf(tw, "last reload error:\t%s (at %s)\n", st.Allowlist.LastError, st.Allowlist.LastErrorAt.Format(time.RFC3339))
	}
	if st.Allowlist.Unsaved != "" {
		fmt.Fprintf(tw, "unsaved allowlist change:\tin force, but the file could not be written: %s (at %s)\n", st.Allowlist.Unsaved, st.Allowlist.UnsavedAt.Format(time.RFC3339))
	}
	// Counters arrive as a JSON object; print them flat and sorted.
	var m map[string]any
	if b, err := json.Marshal(stats); err == nil && json.Unmarshal(b, &m) == nil {
		if msg := api.LogTrouble(m); msg != "" {
			fmt.Fprintf(tw, "decision log error:\t%s\n", msg)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(tw, "%s:\t%v\n", k, m[k])
		}
	}
	tw.Flush()
}

// filterTrouble asks a running instance's filters what status should warn
// about: an allowlist change in force but not saved, a decision log that
// cannot be written. Nothing when the filters do not answer (status shows
// them down already).
func (e *env) filterTrouble(ctx context.Context, name string) []string {
	c, err := e.apiClient(name)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return nil
	}
	return st.Trouble()
}

func newComponentLogsCmd(e *env, component string) *cobra.Command {
	var n int
	var follow, refusals bool
	cmd := &cobra.Command{
		Use:   "logs NAME",
		Short: fmt.Sprintf("Print the %s filter's recent decisions (JSON lines)", component),
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			component := component
			if refusals {
				component += daemon.RefusalsSuffix
			}
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			b, err := c.Logs(ctx, component, n, 0)
			if err != nil {
				return notRunningHint(args[0], err)
			}
			printLines(e.stdout, b.Lines)
			if !follow {
				return nil
			}
			seq := b.Seq
			t := time.NewTicker(300 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
				b, err := c.Logs(ctx, component, 0, seq)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return notRunningHint(args[0], err)
				}
				printLines(e.stdout, b.Lines)
				seq = b.Seq
			}
		},
	}
	cmd.Flags().IntVarP(&n, "lines", "n", 100, "number of recent lines")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new lines")
	cmd.Flags().BoolVar(&refusals, "refusals", false, "only the refusal stream: blocks, their aggregates and warnings, which allowed traffic cannot push out")
	return cmd
}

// printLines prints decision-log lines: JSON whose strings the guest
// chose, with what a terminal would act on escaped.
func printLines(w io.Writer, lines []json.RawMessage) {
	for _, l := range lines {
		fmt.Fprintf(w, "%s\n", termtext.JSON(l))
	}
}

func newAllowlistCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "allowlist",
		Short: "Change the names an instance may reach (both filters, and the file)",
		Long: `Each instance has one allowlist shared by its DNS filter and HTTP proxy.
"example.com" allows exactly that name; "*.example.com" allows every name below
it (not example.com itself). Changes reach both filters and the allowlist file.

A line may carry a rule for the name: NAME [METHOD[,METHOD...]] [PATTERN] [audit],
such as 'api.github.com GET,HEAD /**'. The lines of one name add up; a name with
rules allows only what they allow (docs/policy.md). Quote a line with a pattern:
the shell would expand its *.`,
	}
	var addRules, removeRules []string
	add := &cobra.Command{
		Use:   "add NAME LINE...",
		Short: "Allow names, or add rules to a name",
		Long: `Each LINE is an allowlist line: a name ("example.com") or a name and one
rule ('api.github.com GET,HEAD /**'). The words of a rule may also follow the
name as arguments of their own (api.github.com GET,HEAD '/**'), or be given
with --rule for every name listed (api.github.com --rule 'GET,HEAD /**'). A
name is listed either without rules (everything on it) or with rules, never
both: to change a name from one to the other, remove it first.`,
		Example: `  abox allowlist add dev example.com '*.example.org'
  abox allowlist add dev 'api.github.com GET,HEAD /**' 'api.github.com POST /repos/acme/app/pulls'
  abox allowlist add dev api.github.com --rule 'GET,HEAD /**' --rule 'POST /repos/acme/app/pulls'
  abox allowlist presets github-readonly   # lines to copy`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			lines, err := allowlistLines(args[1:], addRules)
			if err != nil {
				return err
			}
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			added, err := c.AllowlistAdd(cmd.Context(), lines)
			if err != nil {
				return notRunningHint(args[0], err)
			}
			if len(added) == 0 {
				fmt.Fprintln(e.stderr, "already allowed; nothing changed")
			}
			for _, a := range added {
				fmt.Fprintf(e.stderr, "added %s\n", a)
			}
			return nil
		},
	}
	add.Flags().StringArrayVar(&addRules, "rule", nil, "a rule, [METHOD[,METHOD...]] [PATTERN] [audit], for every name given (repeatable)")
	remove := &cobra.Command{
		Use:   "remove NAME LINE...",
		Short: "Stop allowing names, or remove one rule of a name",
		Long: `A name alone removes the name with all its rules. A rule line
('api.github.com POST /repos/acme/app/pulls') removes just that rule; a name
whose last rule is removed is no longer allowed at all (it does not go back
to allowing everything).`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			lines, err := allowlistLines(args[1:], removeRules)
			if err != nil {
				return err
			}
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			removed, err := c.AllowlistRemove(cmd.Context(), lines)
			if err != nil {
				return notRunningHint(args[0], err)
			}
			gone := removed.Lines
			if gone == nil {
				gone = removed.Entries // filters of an abox before rules
			}
			for _, r := range gone {
				fmt.Fprintf(e.stderr, "removed %s\n", termtext.Clean(r))
			}
			for _, g := range removed.Gone {
				fmt.Fprintf(e.stderr, "%s has no rules left and is no longer allowed\n", g)
			}
			return nil
		},
	}
	remove.Flags().StringArrayVar(&removeRules, "rule", nil, "remove this rule of every name given, not the names (repeatable)")
	var listJSON bool
	list := &cobra.Command{
		Use:   "list NAME",
		Short: "Print the allowlist in force, a line per rule",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			b, err := c.Allowlist(cmd.Context())
			if err != nil {
				return err
			}
			if listJSON {
				return writeJSON(e.stdout, b)
			}
			lines := b.Lines
			if lines == nil {
				lines = b.Entries // filters of an abox before rules
			}
			for _, s := range lines {
				fmt.Fprintln(e.stdout, termtext.Clean(s))
			}
			return nil
		}),
	}
	jsonFlag(list.Flags(), &listJSON, "")
	reload := &cobra.Command{
		Use:   "reload NAME",
		Short: "Re-read the allowlist file now",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			st, err := c.Reload(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "reloaded %s: %d entries\n", st.Path, st.Entries)
			return nil
		}),
	}
	cmd.AddCommand(add, remove, list, reload, newAllowlistEditCmd(e), newAllowlistCheckCmd(e), newAllowlistPresetsCmd(e))
	return cmd
}

// allowlistLines turns add's and remove's arguments into allowlist lines.
// Each argument is a line, and an argument that can only be a rule's word
// continues the line before it: one without a dot (a method list, audit;
// no name is without one, bare top-level domains are refused) or one that
// starts with / (a pattern). The first argument is always a line. With
// rules (--rule), every argument is a name and gets each rule.
func allowlistLines(args, rules []string) ([]string, error) {
	if len(rules) > 0 {
		var out []string
		for _, a := range args {
			if f := strings.Fields(a); len(f) != 1 || !strings.Contains(a, ".") {
				return nil, usageError{fmt.Errorf("%q: with --rule, give names only (api.github.com --rule 'GET,HEAD /**')", a)}
			}
			for _, r := range rules {
				out = append(out, strings.TrimSpace(a)+" "+r)
			}
		}
		return out, nil
	}
	var out []string
	patterns := 0
	for _, a := range args {
		w := strings.TrimSpace(a)
		cont := len(out) > 0 && w != "" && !strings.ContainsAny(w, " \t") && (!strings.Contains(w, ".") || strings.HasPrefix(w, "/"))
		if !cont {
			out = append(out, a)
			patterns = 0
			if f := strings.Fields(a); len(f) > 1 {
				patterns = strings.Count(" "+strings.Join(f[1:], " "), " /")
			}
			continue
		}
		if strings.HasPrefix(w, "/") {
			if patterns++; patterns > 1 {
				return nil, withHint(fmt.Errorf("%q: two patterns in one line (%s %s)", out[len(out)-1]+" "+w, out[len(out)-1], w),
					"quote each line: the shell expands * in an unquoted pattern into file names ('api.github.com GET /**')")
			}
		}
		out[len(out)-1] += " " + w
	}
	return out, nil
}

// newAllowlistPresetsCmd shows the presets: blocks of lines for common
// cases, to copy into an allowlist or abox.yaml and cut down.
func newAllowlistPresetsCmd(e *env) *cobra.Command {
	var asJSON, asYAML bool
	cmd := &cobra.Command{
		Use:   "presets [PRESET]",
		Short: "List the presets of rules, or print one's lines to copy",
		Long: `A preset is a block of allowlist lines for a common case (read-only GitHub,
a package registry read-only, an agent's model API). Without PRESET it lists
them; with one it prints its lines, with what they leave out as comments, to
copy into an allowlist file (abox allowlist edit) or, with --yaml, into
abox.yaml's allowlist, and cut down. No list names a preset: the lines are
what counts, and what trust is given to (docs/policy.md has each one's why).`,
		Example: `  abox allowlist presets
  abox allowlist presets github-readonly >> allow.txt
  abox allowlist presets npm-readonly --yaml`,
		Args: cobra.MaximumNArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			var names []string
			for _, p := range allowlist.Presets() {
				names = append(names, p.Name)
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				ps := allowlist.Presets()
				if asJSON {
					return writeJSON(e.stdout, ps)
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				for _, p := range ps {
					about, _, _ := strings.Cut(p.About, "\n")
					n := fmt.Sprintf("%d lines", len(p.Lines))
					if len(p.Lines) == 1 {
						n = "1 line"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, n, about)
				}
				return tw.Flush()
			}
			p, ok := allowlist.PresetByName(args[0])
			if !ok {
				var names []string
				for _, p := range allowlist.Presets() {
					names = append(names, p.Name)
				}
				return usageError{fmt.Errorf("no preset %q (known: %s)", args[0], strings.Join(names, ", "))}
			}
			switch {
			case asJSON:
				return writeJSON(e.stdout, p)
			case asYAML:
				fmt.Fprint(e.stdout, presetYAML(p))
			default:
				fmt.Fprint(e.stdout, p.Text())
			}
			return nil
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	cmd.Flags().BoolVar(&asYAML, "yaml", false, "print the lines as abox.yaml allowlist items")
	return cmd
}

// presetYAML renders p as items of abox.yaml's allowlist, one quoted line
// each (a pattern's * and ? mean nothing to YAML inside quotes).
func presetYAML(p allowlist.Preset) string {
	var b strings.Builder
	b.WriteString("allowlist:\n  # preset " + p.Name + ": " + strings.ReplaceAll(p.About, "\n", "\n  # ") + "\n")
	for _, l := range p.Lines {
		fmt.Fprintf(&b, "  - %q\n", l)
	}
	return b.String()
}

// newAllowlistCheckCmd validates a file offline, so users can check an edit
// before the filters see it.
func newAllowlistCheckCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE",
		Short: "Validate an allowlist file without applying it",
		Args:  exactArgs(1, "a FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return fmt.Errorf("checking allowlist: %w", err)
			}
			defer f.Close()
			l, err := allowlist.Parse(f, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s: %d entries, all valid\n", args[0], l.Len())
			return nil
		},
	}
}

func newNetCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "net", Short: "Filter mode and passive-mode profiles"}
	filter := &cobra.Command{
		Use:   "filter NAME [active|passive]",
		Short: "Show or set the filter mode of an instance",
		Long: `active enforces the allowlist. passive allows every name and records it, to
discover what a workload needs; private and host addresses stay blocked.
Never use passive mode with untrusted workloads. A restarted filter comes back active.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			if len(args) == 1 {
				m, err := c.Mode(cmd.Context())
				if err != nil {
					return notRunningHint(args[0], err)
				}
				fmt.Fprintln(e.stdout, m)
				return nil
			}
			m, err := policy.ParseMode(args[1])
			if err != nil {
				return usageError{err}
			}
			if err := c.SetMode(cmd.Context(), m); err != nil {
				return notRunningHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "%s: filter mode %s\n", args[0], m)
			return nil
		},
	}
	profile := &cobra.Command{Use: "profile", Short: "Names recorded in passive mode"}
	var showJSON bool
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "List the names seen in passive mode",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := fetchProfile(cmd.Context(), e, args[0])
			if err != nil {
				return err
			}
			if showJSON {
				return writeJSON(e.stdout, p)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tLISTED\tCOUNT\tLAST SEEN")
			for _, en := range p.Entries {
				fmt.Fprintf(tw, "%s\t%v\t%d\t%s\n", en.Name, en.Listed, en.Count, en.LastSeen.Format(time.RFC3339))
			}
			tw.Flush()
			if p.Dropped > 0 {
				fmt.Fprintf(e.stderr, "%d further names were not recorded (limit %d)\n", p.Dropped, p.Limit)
			}
			return nil
		},
	}
	jsonFlag(show.Flags(), &showJSON, "")
	var out string
	export := &cobra.Command{
		Use:   "export NAME",
		Short: "Write the recorded names in allowlist format",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := fetchProfile(cmd.Context(), e, args[0])
			if err != nil {
				return err
			}
			var entries []allowlist.Entry
			for _, en := range p.Entries {
				if en.Name == policy.HealthcheckName {
					continue
				}
				entries = append(entries, allowlist.Entry{Name: en.Name})
			}
			text := fmt.Sprintf("# passive-mode profile of %s, %s\n", args[0], time.Now().UTC().Format(time.RFC3339)) + allowlist.Format(entries)
			if out == "" || out == "-" {
				_, err := io.WriteString(e.stdout, text)
				return err
			}
			if err := fsutil.WriteFileAtomic(out, []byte(text), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "wrote %d names to %s\n", len(entries), out)
			return nil
		},
	}
	export.Flags().StringVarP(&out, "output", "o", "", "write to FILE instead of stdout")
	clear := &cobra.Command{
		Use:   "clear NAME",
		Short: "Forget the recorded names",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			if err := c.ClearProfile(cmd.Context()); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "%s: profile cleared\n", name)
			return nil
		}),
	}
	profile.AddCommand(show, export, clear)
	cmd.AddCommand(filter, profile)
	cmd.AddCommand(newLearnCmds(e)...)
	return cmd
}

func fetchProfile(ctx context.Context, e *env, name string) (policy.ProfileSnapshot, error) {
	c, err := e.apiClient(name)
	if err != nil {
		return policy.ProfileSnapshot{}, err
	}
	p, err := c.Profile(ctx)
	if err != nil {
		return p, notRunningHint(name, err)
	}
	return p, nil
}

// newAllowlistEditCmd edits a copy of the allowlist in $EDITOR and installs
// it only once it parses, so the filters never see a half-edited or invalid
// file.
func newAllowlistEditCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "edit NAME",
		Short: "Edit the allowlist in $EDITOR; it is applied only if every line is valid",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: apiRun(e, func(cmd *cobra.Command, c *api.Client, name string) error {
			// The text in force, which is the file's unless a change
			// could not be saved.
			cur, err := c.AllowlistText(cmd.Context())
			if err != nil {
				return err
			}
			orig := []byte(cur.Text)
			tmp, err := os.CreateTemp("", "abox-allowlist-*.txt")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if _, err := tmp.Write(orig); err != nil {
				tmp.Close()
				return err
			}
			tmp.Close()
			in := bufio.NewReader(e.stdin)
			for {
				if err := runEditor(cmd.Context(), e, tmp.Name()); err != nil {
					return err
				}
				edited, err := os.ReadFile(tmp.Name())
				if err != nil {
					return err
				}
				if bytes.Equal(edited, orig) {
					fmt.Fprintln(e.stderr, "no changes")
					return nil
				}
				if _, perr := allowlist.Parse(bytes.NewReader(edited), cur.Path); perr != nil {
					fmt.Fprintf(e.stderr, "%v\nedit again? [Y/n] ", perr)
					answer, _ := in.ReadString('\n')
					if a := strings.ToLower(strings.TrimSpace(answer)); a == "n" || a == "no" || answer == "" {
						return errors.New("allowlist unchanged: the edit had invalid lines")
					}
					continue
				}
				// In force at once, then saved by the filters; refused if
				// the list changed while the editor was open.
				st, err := c.ReplaceAllowlist(cmd.Context(), string(orig), string(edited))
				var ae *api.Error
				if errors.As(err, &ae) && ae.Status == http.StatusConflict {
					return withHint(errors.New("allowlist unchanged: it changed while you were editing"), "run abox allowlist edit again")
				}
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "applied %s: %d entries\n", st.Path, st.Entries)
				return nil
			}
		}),
	}
}

// runEditor runs $VISUAL or $EDITOR (default vi) on path, attached to the terminal.
func runEditor(ctx context.Context, e *env, path string) error {
	ed := os.Getenv("VISUAL")
	if ed == "" {
		ed = os.Getenv("EDITOR")
	}
	if ed == "" {
		ed = "vi"
	}
	argv := strings.Fields(ed)
	c := exec.CommandContext(ctx, argv[0], append(argv[1:], path)...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, e.stderr, e.stderr
	if err := c.Run(); err != nil {
		return fmt.Errorf("running editor %s: %w (set EDITOR)", argv[0], err)
	}
	return nil
}
