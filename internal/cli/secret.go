package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

func newSecretCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Keep credentials on the host and bind them to the hosts they may go to",
		Long: `A secret's value stays on the host, in the abox data directory (secrets/, 0700),
outside every instance: never in the guest, its disk, snapshots or exports. A
binding names the instance, host, optional request rules and header the secret
may be sent in; the guest gets a placeholder in an environment variable named
after the secret. An abox.yaml may name bindings too (secrets:); see docs/secrets.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return usageError{fmt.Errorf("%s needs a subcommand: set, list, rm, bind, unbind or env (see --help)", cmd.CommandPath())}
		},
	}
	cmd.AddCommand(newSecretSetCmd(e), newSecretListCmd(e), newSecretRmCmd(e),
		newSecretBindCmd(e), newSecretUnbindCmd(e), newSecretEnvCmd(e))
	return cmd
}

func (e *env) secretStore() (*secrets.Store, paths.Layout, error) {
	l, err := e.layout()
	if err != nil {
		return nil, l, err
	}
	return secrets.Open(l.Secrets()), l, nil
}

// secretNameArg checks the one NAME argument. A second argument is most
// likely a value typed on the command line: the error does not repeat it.
func secretNameArg(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return usageError{fmt.Errorf("%s takes a secret NAME (see --help)", cmd.CommandPath())}
	case len(args) > 1 && cmd.Name() == "set":
		return usageError{fmt.Errorf("%s reads the value from standard input or --from-file, never from an argument (it would stay in the shell's history and in ps); run: %s %s < FILE", cmd.CommandPath(), cmd.CommandPath(), args[0])}
	case len(args) > 1:
		return usageError{fmt.Errorf("%s takes one secret NAME (got %d arguments; see --help)", cmd.CommandPath(), len(args))}
	}
	if err := secrets.CheckName(args[0]); err != nil {
		return usageError{err}
	}
	return nil
}

func newSecretSetCmd(e *env) *cobra.Command {
	var fromFile, command string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "set NAME",
		Short: "Store or rotate a secret (the value from standard input, a file or a host command)",
		Long: `Store the value of secret NAME, or replace it: a running filter daemon reads the
value at every use, so the next request carries the new one. Bindings and
placeholders are kept.

The value is read from standard input (a prompt without echo on a terminal),
from --from-file, or comes from --command, a host command run at every use
whose output is never stored or logged. One trailing line end is dropped.`,
		Example: `  abox secret set OPENAI_API_KEY                      # prompts
  pass show openai | abox secret set OPENAI_API_KEY
  abox secret set GH_TOKEN --from-file ~/.config/gh-token
  abox secret set GH_TOKEN --command 'gh auth token'`,
		Args: secretNameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if fromFile != "" && command != "" {
				return usageError{errors.New("give --from-file or --command, not both")}
			}
			if timeout != 0 && command == "" {
				return usageError{errors.New("--timeout bounds --command; give it only with --command")}
			}
			s, _, err := e.secretStore()
			if err != nil {
				return err
			}
			if command != "" {
				if err := s.SetCommand(name, command, timeout); err != nil {
					return err
				}
				fmt.Fprintf(e.stderr, "secret %s: value from `%s`, run on the host at every use\n", name, termtext.Clean(command))
				return nil
			}
			v, err := e.readSecretValue(name, fromFile)
			if err != nil {
				return err
			}
			defer clear(v)
			if err := s.Set(name, v); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "secret %s stored\n", name)
			return nil
		},
	}
	cmd.Flags().StringVar(&fromFile, "from-file", "", "read the value from `FILE` (- for standard input)")
	cmd.Flags().StringVar(&command, "command", "", "run `CMD` with /bin/sh on the host at every use; its output is the value")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "with --command: how long it may run (default 10s)")
	return cmd
}

// readSecretValue reads a value from a file, a terminal (no echo) or
// standard input, at most what one header can carry.
func (e *env) readSecretValue(name, file string) ([]byte, error) {
	var r io.Reader = e.stdin
	switch {
	case file != "" && file != "-":
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("reading the value of %s: %w", name, err)
		}
		defer f.Close()
		r = f
	case file == "":
		if f, ok := e.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			fmt.Fprintf(e.stderr, "Value of %s (not echoed): ", name)
			v, err := term.ReadPassword(int(f.Fd()))
			fmt.Fprintln(e.stderr)
			if err != nil {
				return nil, fmt.Errorf("reading the value of %s from the terminal: %w", name, err)
			}
			return v, nil
		}
	}
	v, err := io.ReadAll(io.LimitReader(r, secrets.MaxValueBytes+3))
	if err != nil {
		return nil, fmt.Errorf("reading the value of %s: %w", name, err)
	}
	if len(bytes.TrimSpace(v)) == 0 {
		return nil, withHint(fmt.Errorf("secret %s: no value on standard input", name),
			fmt.Sprintf("pipe it in (`pass show x | abox secret set %s`), give --from-file FILE, or run on a terminal to be prompted", name))
	}
	return v, nil
}

func newSecretListCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List secrets with their bindings and last use (never values)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, _, err := e.secretStore()
			if err != nil {
				return err
			}
			list, err := s.List()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, list)
			}
			if len(list) == 0 {
				fmt.Fprintln(e.stderr, "no secrets; store one with `abox secret set NAME`")
				return nil
			}
			w := tabwriter.NewWriter(termtext.NewWriter(e.stdout), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "NAME\tSOURCE\tLAST USED\tBINDINGS")
			for _, in := range list {
				src := in.Source
				if in.Source == secrets.SourceCommand {
					src = "command: " + in.Command
				}
				used := "never"
				if !in.LastUsed.IsZero() {
					used = in.LastUsed.Format(time.RFC3339)
				}
				if len(in.Bindings) == 0 {
					fmt.Fprintf(w, "%s\t%s\t%s\t(none)\n", in.Name, src, used)
				}
				for i, b := range in.Bindings {
					if i == 0 {
						fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", in.Name, src, used, b)
					} else {
						fmt.Fprintf(w, "\t\t\t%s\n", b)
					}
				}
			}
			return w.Flush()
		},
	}
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}

func newSecretRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME",
		Aliases: []string{"remove"},
		Short:   "Remove a secret, its value, bindings and placeholders",
		Args:    secretNameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, _, err := e.secretStore()
			if err != nil {
				return err
			}
			if err := s.Remove(args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "secret %s removed\n", args[0])
			return nil
		},
	}
}

// bindFlags are the flags that name a binding's target.
type bindFlags struct {
	instance, host string
}

func (f *bindFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&f.instance, "instance", "i", "", "the `INSTANCE` whose guest may use the secret")
	cmd.Flags().StringVar(&f.host, "host", "", "the `HOST` it may go to: api.example.com, *.example.com, or with :PORT (default 443)")
}

func (f *bindFlags) check(l paths.Layout) error {
	if f.instance == "" {
		return usageError{errors.New("name the instance with --instance NAME")}
	}
	if err := validate.InstanceName(f.instance); err != nil {
		return usageError{err}
	}
	if f.host == "" {
		return usageError{errors.New("name the host with --host, such as --host api.example.com")}
	}
	if _, err := os.Stat(l.Instance(f.instance).State); errors.Is(err, fs.ErrNotExist) {
		return withHint(fmt.Errorf("instance %s does not exist", f.instance), "`abox list` shows the existing instances")
	}
	return nil
}

func newSecretBindCmd(e *env) *cobra.Command {
	var bf bindFlags
	var spec secrets.BindingSpec
	cmd := &cobra.Command{
		Use:   "bind NAME --instance INSTANCE --host HOST (--bearer | --basic USER | --header NAME)",
		Short: "Allow a secret to be sent from an instance to a host, in one header",
		Long: `Bind secret NAME to a host for one instance: only requests of that instance to
HOST (exact, or *.domain below a registrable domain) on intercepted HTTPS, and
matching one --rule when any is given, carry the value, in the header chosen.
Binding the same instance and host again replaces the binding.

A rule is the request-rule syntax of the allowlist: [METHOD[,METHOD...]] PATTERN,
where * is one path segment and ** any number of them.

The guest sees the placeholder in $NAME. A guest created before the binding
does not have it yet: see docs/secrets.md.`,
		Example: `  abox secret bind OPENAI_API_KEY --instance dev --host api.openai.com --bearer --rule 'POST /v1/**'
  abox secret bind ANTHROPIC_API_KEY -i dev --host api.anthropic.com --header x-api-key
  abox secret bind GH_TOKEN -i dev --host github.com --basic x-access-token --rule 'GET,POST /me/repo.git/**'`,
		Args: secretNameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, l, err := e.secretStore()
			if err != nil {
				return err
			}
			if err := bf.check(l); err != nil {
				return err
			}
			spec.Instance, spec.Host = bf.instance, bf.host
			b, err := secrets.ParseBinding(spec)
			if err != nil {
				return usageError{err}
			}
			ph, err := s.Bind(args[0], b)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "secret %s bound: %s\nthe guest's placeholder: %s=%s\n", args[0], b, args[0], ph)
			return nil
		},
	}
	bf.add(cmd)
	cmd.Flags().StringArrayVar(&spec.Rules, "rule", nil, "only requests matching `RULE`, such as 'POST /v1/**' (repeatable; default: every request to the host)")
	cmd.Flags().BoolVar(&spec.Bearer, "bearer", false, "send it as Authorization: Bearer VALUE")
	cmd.Flags().StringVar(&spec.Basic, "basic", "", "send it as Authorization: Basic with `USER` and the value as password")
	cmd.Flags().StringVar(&spec.Header, "header", "", "send it as the value of header `NAME`, such as x-api-key")
	return cmd
}

func newSecretUnbindCmd(e *env) *cobra.Command {
	var bf bindFlags
	cmd := &cobra.Command{
		Use:   "unbind NAME --instance INSTANCE --host HOST",
		Short: "Remove a secret's binding to a host",
		Args:  secretNameArg,
		RunE: func(cmd *cobra.Command, args []string) error {
			s, _, err := e.secretStore()
			if err != nil {
				return err
			}
			if bf.instance == "" || bf.host == "" {
				return usageError{errors.New("name the binding with --instance NAME and --host HOST (abox secret list shows them)")}
			}
			if err := s.Unbind(args[0], bf.instance, bf.host); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "secret %s unbound from %s for %s\n", args[0], bf.host, bf.instance)
			return nil
		},
	}
	bf.add(cmd)
	return cmd
}

func newSecretEnvCmd(e *env) *cobra.Command {
	var asJSON, pamEnv bool
	var instance string
	cmd := &cobra.Command{
		Use:   "env --instance INSTANCE",
		Short: "Print the placeholders an instance's guest gets, as shell assignments",
		Long: `Print NAME=PLACEHOLDER for every secret bound for the instance. A placeholder is
random, different per instance and useless anywhere but through the proxy, so it
may be shown and copied into the guest, for example:

  abox secret env -i dev | abox ssh dev -- sudo tee /etc/profile.d/abox-secrets.sh

--environment prints the /etc/environment form (no export), which ssh sessions
and sudo read through pam_env.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validate.InstanceName(instance); err != nil {
				return usageError{fmt.Errorf("--instance: %w", err)}
			}
			s, _, err := e.secretStore()
			if err != nil {
				return err
			}
			env, err := s.Placeholders(instance)
			if err != nil {
				return err
			}
			if asJSON {
				m := map[string]string{}
				for _, kv := range env {
					m[kv[0]] = kv[1]
				}
				return writeJSON(e.stdout, m)
			}
			var b strings.Builder
			for _, kv := range env {
				if !pamEnv {
					b.WriteString("export ")
				}
				fmt.Fprintf(&b, "%s=%s\n", kv[0], kv[1])
			}
			_, err = io.WriteString(e.stdout, b.String())
			return err
		},
	}
	cmd.Flags().StringVarP(&instance, "instance", "i", "", "the `INSTANCE`")
	cmd.Flags().BoolVar(&pamEnv, "environment", false, "print NAME=PLACEHOLDER lines for /etc/environment")
	jsonFlag(cmd.Flags(), &asJSON, "")
	return cmd
}
