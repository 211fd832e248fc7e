// Package cli adapts the abox command line to the internal packages: it parses
// flags, calls one function and renders the result, nothing else.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/termtext"
)

// Version is set at build time with -ldflags "-X .../internal/cli.Version=v1.2.3".
var Version = "dev"

// Exit codes decided in one place.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// env is what every command may use: the data layout and the streams.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	layout         func() (paths.Layout, error)
}

// hintError carries a hint for the user, printed once under the error.
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

func withHint(err error, hint string) error { return &hintError{err: err, hint: hint} }

type usageError struct{ error }

// Main runs the CLI and returns the process exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr, layout: paths.Default}
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ce exitCodeError
	if errors.As(err, &ce) {
		return ce.code
	}
	// Errors name paths a repository chose and text a guest sent: shown
	// with their control characters escaped, never obeyed.
	errOut := termtext.NewWriter(stderr)
	defer errOut.Flush()
	fmt.Fprintf(errOut, "abox: %v\n", err)
	// A guest program's status (a provisioning script, scp) is abox's.
	var ge *guest.ExitError
	if errors.As(err, &ge) && ge.Code > 0 {
		return ge.Code
	}
	printHints(errOut, err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	return exitError
}

// printHints writes the advice for err under it: a command's own hint,
// else the one for the facts it carries (factHint), and the filter API's.
func printHints(w io.Writer, err error) {
	var he *hintError
	if errors.As(err, &he) && he.hint != "" {
		fmt.Fprintf(w, "hint: %s\n", he.hint)
	} else if h := factHint(err); h != "" {
		fmt.Fprintf(w, "hint: %s\n", h)
	}
	var ae *api.Error
	if errors.As(err, &ae) && ae.Hint != "" {
		fmt.Fprintf(w, "hint: %s\n", ae.Hint)
	}
}

func newRootCmd(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "abox",
		Short: "Run AI coding agents in filtered, isolated virtual machines",
		Long: `abox runs autonomous coding agents inside virtual machines and controls
everything they can reach: a DNS allowlist filter and a filtering HTTP/HTTPS
proxy on the gateway, a stateful packet filter, and a host-only network per
instance.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageError{fmt.Errorf("%w (see %s --help)", err, c.CommandPath())}
	})
	root.AddCommand(
		newCreateCmd(e),
		newStartCmd(e),
		newStopCmd(e),
		newRestartCmd(e),
		newRemoveCmd(e),
		newExportCmd(e),
		newImportCmd(e),
		newListCmd(e),
		newStatusCmd(e),
		newSSHCmd(e),
		newSCPCmd(e),
		newProvisionCmd(e),
		newForwardCmd(e),
		newMountCmd(e),
		newUnmountCmd(e),
		newInitCmd(e),
		newUpCmd(e),
		newDownCmd(e),
		newTrustCmd(e),
		newABoxYAMLHelp(),
		newBaseCmd(e),
		newDaemonCmd(e),
		newVersionCmd(e),
		newDNSCmd(e),
		newHTTPCmd(e),
		newAllowlistCmd(e),
		newNetCmd(e),
		newExplainCmd(e),
		newCheckDepsCmd(e),
		newTapCmd(e),
		newDoctorCmd(e),
		newLibvirtHookCmd(e),
		newMonitorCmd(e),
		newSnapshotCmd(e),
		newSecretCmd(e),
		newMetricsCmd(e),
		newAuditCmd(e),
	)
	groupCommands(e, root)
	return root
}

func newVersionCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the abox version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := struct {
				Version string `json:"version"`
				Go      string `json:"go"`
			}{Version: Version}
			if bi, ok := debug.ReadBuildInfo(); ok {
				v.Go = bi.GoVersion
				if Version == "dev" {
					for _, s := range bi.Settings {
						if s.Key == "vcs.revision" && len(s.Value) >= 12 {
							v.Version = "dev-" + s.Value[:12]
						}
					}
				}
			}
			if asJSON {
				return writeJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "abox %s (%s)\n", v.Version, v.Go)
			return nil
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	// Values can be a guest's (names it asked for, what it printed):
	// encoding/json leaves C1 and bidirectional controls as they are.
	_, err = w.Write(append(termtext.JSON(b), '\n'))
	return err
}

// exactArgs is cobra.ExactArgs with an error that names what is missing.
func exactArgs(n int, names string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %s (got %d arguments; see --help)", cmd.CommandPath(), names, len(args))}
		}
		return nil
	}
}

// jsonFlag declares a command's --json, the switch of every read command
// to machine output; usage "" is the common "print JSON".
func jsonFlag(fs *pflag.FlagSet, p *bool, usage string) {
	if usage == "" {
		usage = "print JSON"
	}
	fs.BoolVar(p, "json", false, usage)
}
