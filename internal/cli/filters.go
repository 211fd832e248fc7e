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
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if err != nil {
				return notRunningHint(args[0], err)
			}
			stats, ok := st.Components[component]
			if !ok {
				return fmt.Errorf("instance %s runs no %s filter", args[0], component)
			}
			if asJSON {
				return writeJSON(e.stdout, map[string]any{
					"instance": st.Instance, "mode": st.Mode, "allowlist": st.Allowlist, component: stats,
				})
			}
			renderStatus(e.stdout, st, component, stats)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
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
it (not example.com itself). Changes reach both filters and the allowlist file.`,
	}
	add := &cobra.Command{
		Use:   "add NAME ENTRY...",
		Short: "Allow names",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			added, err := c.AllowlistAdd(cmd.Context(), args[1:])
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
	remove := &cobra.Command{
		Use:   "remove NAME ENTRY...",
		Short: "Stop allowing names",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			removed, err := c.AllowlistRemove(cmd.Context(), args[1:])
			if err != nil {
				return notRunningHint(args[0], err)
			}
			for _, r := range removed {
				fmt.Fprintf(e.stderr, "removed %s\n", r)
			}
			return nil
		},
	}
	var listJSON bool
	list := &cobra.Command{
		Use:   "list NAME",
		Short: "Print the allowlist in force",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			b, err := c.Allowlist(cmd.Context())
			if err != nil {
				return notRunningHint(args[0], err)
			}
			if listJSON {
				return writeJSON(e.stdout, b)
			}
			for _, s := range b.Entries {
				fmt.Fprintln(e.stdout, s)
			}
			return nil
		},
	}
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	reload := &cobra.Command{
		Use:   "reload NAME",
		Short: "Re-read the allowlist file now",
		Args:  exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			st, err := c.Reload(cmd.Context())
			if err != nil {
				return notRunningHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "reloaded %s: %d entries\n", st.Path, st.Entries)
			return nil
		},
	}
	cmd.AddCommand(add, remove, list, reload, newAllowlistEditCmd(e), newAllowlistCheckCmd(e))
	return cmd
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
	show.Flags().BoolVar(&showJSON, "json", false, "print JSON")
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
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			if err := c.ClearProfile(cmd.Context()); err != nil {
				return notRunningHint(args[0], err)
			}
			fmt.Fprintf(e.stderr, "%s: profile cleared\n", args[0])
			return nil
		},
	}
	profile.AddCommand(show, export, clear)
	cmd.AddCommand(filter, profile)
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
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.apiClient(args[0])
			if err != nil {
				return err
			}
			// The text in force, which is the file's unless a change
			// could not be saved.
			cur, err := c.AllowlistText(cmd.Context())
			if err != nil {
				return notRunningHint(args[0], err)
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
		},
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
