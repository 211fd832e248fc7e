package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/audit"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

func newAuditCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Verify and export an instance's tamper-evident audit stream (docs/audit.md)"}
	cmd.AddCommand(newAuditVerifyCmd(e), newAuditExportCmd(e))
	return cmd
}

// auditStream returns the layout and the audit directory of instance name,
// which must exist.
func (e *env) auditStream(name string) (paths.Layout, string, error) {
	if err := validate.InstanceName(name); err != nil {
		return paths.Layout{}, "", usageError{err}
	}
	l, err := e.layout()
	if err != nil {
		return l, "", err
	}
	dir := instance.AuditDir(l.Instance(name))
	if _, err := os.Stat(dir); err != nil {
		return l, "", withHint(fmt.Errorf("instance %s has no audit stream (%s): %w", name, dir, err),
			"the filters start one when the instance starts; check the name with `abox list`")
	}
	return l, dir, nil
}

func newAuditVerifyCmd(e *env) *cobra.Command {
	var asJSON bool
	var bundle, keyFile string
	cmd := &cobra.Command{
		Use:   "verify [NAME]",
		Short: "Check that no line of an audit stream was changed, removed or reordered",
		Long: `Check an instance's audit stream, or with --bundle a bundle that
abox audit export wrote (on any machine): every line must chain to the one
before it and every checkpoint must carry the key's MAC. Each problem is
named by file and line. The key is this host's, or --key FILE, or the
bundle's own if it was exported --with-key.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if bundle != "" {
				return cobra.NoArgs(cmd, args)
			}
			return exactArgs(1, "an instance NAME (or --bundle DIR)")(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var key []byte
			if keyFile != "" {
				k, err := audit.ReadKey(keyFile)
				if err != nil {
					return err
				}
				key = k
			}
			var (
				rep   audit.Report
				what  string
				files string
				err   error
			)
			if bundle != "" {
				what, files = "bundle "+bundle, bundle
				_, rep, err = audit.VerifyBundle(bundle, key)
			} else {
				var l paths.Layout
				if l, files, err = e.auditStream(args[0]); err != nil {
					return err
				}
				what = "the audit stream of " + args[0]
				if key == nil {
					if key, err = audit.ReadKey(instance.AuditKey(l)); err != nil {
						return withHint(err, "the key is written when an instance's filters first start; without it only the chain can be checked: pass --key FILE")
					}
				}
				rep, err = audit.Verify(files, key, audit.Anchor{})
			}
			if err != nil {
				return err
			}
			if asJSON {
				if err := writeJSON(e.stdout, rep); err != nil {
					return err
				}
			} else {
				for _, p := range rep.Problems {
					fmt.Fprintf(e.stdout, "%s\n", filepath.Join(files, p.String()))
				}
			}
			if !rep.OK() {
				return fmt.Errorf("%s does not verify: %d problem(s)", what, len(rep.Problems))
			}
			if !asJSON {
				fmt.Fprintf(e.stdout, "%s verifies: %d lines in %d file(s), %d checkpoints", what, rep.Lines, len(rep.Files), rep.Checkpoints)
				if rep.Unsealed > 0 {
					fmt.Fprintf(e.stdout, " (the last %d lines are chained but not yet behind a checkpoint)", rep.Unsealed)
				}
				fmt.Fprintln(e.stdout)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&bundle, "bundle", "", "verify the bundle in `DIR` instead of an instance's stream")
	cmd.Flags().StringVar(&keyFile, "key", "", "checkpoint key `FILE` (default: this host's, or the bundle's own)")
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func newAuditExportCmd(e *env) *cobra.Command {
	var out, since string
	var withKey bool
	cmd := &cobra.Command{
		Use:   "export NAME --out DIR",
		Short: "Write an instance's audit stream, its policy and their hashes as a bundle",
		Long: `Write a bundle into the new directory DIR: the audit stream's files (from
--since on), the allowlist in force and its SHA-256, and a manifest of every
file's SHA-256. The stream is verified first. With --with-key the host's
checkpoint key goes into the bundle, so that another machine can check the
checkpoints: whoever holds such a bundle could also forge them.`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if out == "" {
				return usageError{errors.New("--out: name the bundle's new directory")}
			}
			from, err := parseSince(since, time.Now())
			if err != nil {
				return usageError{fmt.Errorf("--since: %w", err)}
			}
			l, dir, err := e.auditStream(name)
			if err != nil {
				return err
			}
			key, err := audit.ReadKey(instance.AuditKey(l))
			if err != nil {
				return err
			}
			policy, err := e.policyInForce(cmd, l, name)
			if err != nil {
				return err
			}
			m, err := audit.Export(audit.ExportConfig{Instance: name, Dir: dir, Out: out, Since: from, Policy: policy, Key: key, IncludeKey: withKey})
			if err != nil {
				return err
			}
			// The export is itself evidence.
			if err := recordExport(dir, key, map[string]any{"out": out, "files": len(m.Files), "since": m.Since, "policy_sha256": m.PolicySHA256, "with_key": withKey}); err != nil {
				fmt.Fprintf(e.stderr, "warning: the export was written but not recorded in the audit stream: %v\n", err)
			}
			fmt.Fprintf(e.stderr, "exported %d file(s) of %s's audit stream to %s (policy sha256 %s)\n", len(m.Files), name, out, m.PolicySHA256)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the bundle's new `DIR`")
	cmd.Flags().StringVar(&since, "since", "", "leave out files older than `TIME` (RFC 3339, or a duration such as 24h for that long ago)")
	cmd.Flags().BoolVar(&withKey, "with-key", false, "put the host's checkpoint key in the bundle")
	return cmd
}

// policyInForce is the allowlist text the running filters enforce, or the
// file's when they are not running.
func (e *env) policyInForce(cmd *cobra.Command, l paths.Layout, name string) ([]byte, error) {
	t, err := api.NewClient(l.APISocket(name)).AllowlistText(cmd.Context())
	if err == nil {
		return []byte(t.Text), nil
	}
	if !errors.Is(err, api.ErrNotRunning) {
		return nil, err
	}
	b, err := os.ReadFile(l.Allowlist(name))
	if err != nil {
		return nil, fmt.Errorf("reading the allowlist of %s: %w", name, err)
	}
	return b, nil
}

// parseSince reads --since: empty (everything), RFC 3339, or a duration
// before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 && !strings.HasPrefix(s, "-") {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-12-04T18:00:00Z) nor a duration (24h)", s)
}

func recordExport(dir string, key []byte, data any) error {
	s, err := audit.Open(audit.Config{Dir: dir, Key: key})
	if err != nil {
		return err
	}
	if err := s.Append(audit.KindExport, data); err != nil {
		s.Close()
		return err
	}
	return s.Close()
}
