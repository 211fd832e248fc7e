package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/project"
	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

func (e *env) trustStore() (config.TrustStore, error) {
	l, err := e.layout()
	if err != nil {
		return config.TrustStore{}, err
	}
	return config.TrustStore{Dir: filepath.Join(l.Root, "trust")}, nil
}

func loadProject(file string) (*config.Project, error) {
	p, err := config.Load(file)
	if errors.Is(err, os.ErrNotExist) && file == config.FileName {
		return nil, withHint(err, "write one with `abox init`, or name it with -f FILE")
	}
	return p, err
}

// projectManager loads the abox.yaml and connects to the hypervisor; the
// returned function releases both.
func (e *env) projectManager(ctx context.Context, file string) (*config.Project, *instance.Manager, func(), error) {
	p, err := loadProject(file)
	if err != nil {
		return nil, nil, nil, err
	}
	m, closeFn, err := e.manager(ctx)
	if err != nil {
		p.Close()
		return nil, nil, nil, err
	}
	return p, m, func() { closeFn(); p.Close() }, nil
}

func newInitCmd(e *env) *cobra.Command {
	var presets []string
	var name, file string
	var force bool
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Write a commented starter abox.yaml in the current directory",
		Long: `Write a commented abox.yaml: every key, the active ones at their hardened
defaults, the ones that widen the sandbox commented out. --preset adds the
allowlist entries a common agent or toolchain needs, as a block of its own you
can read and cut. Presets: ` + config.PresetNames() + `.`,
		Example: "  abox init --preset claude --preset github --preset npm\n  abox up",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				wd, err := os.Getwd()
				if err != nil {
					return err
				}
				name = strings.ToLower(filepath.Base(wd))
				if validate.InstanceName(name) != nil {
					name = "dev"
				}
			} else if err := validate.InstanceName(name); err != nil {
				return usageError{err}
			}
			text, err := config.Starter(name, presets)
			if err != nil {
				return usageError{err}
			}
			if _, err := os.Lstat(file); err == nil && !force {
				return withHint(fmt.Errorf("%s exists", file), "edit it, or overwrite it with `abox init --force`")
			}
			if err := fsutil.WriteFileAtomic(file, []byte(text), 0o644); err != nil {
				return err
			}
			// The presets' names widen the allowlist; this content is
			// abox's and asked for by the user, so it is trusted as
			// written (an edit that allows more asks again).
			if err := e.trustWritten(file, []byte(text)); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "wrote %s (instance %s); bring it up with `abox up`\n", file, name)
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&presets, "preset", nil, "add a preset's allowlist entries, repeatable: "+config.PresetNames())
	cmd.Flags().StringVar(&name, "name", "", "instance name (default: the directory's name)")
	cmd.Flags().StringVarP(&file, "file", "f", config.FileName, "file to write")
	cmd.Flags().BoolVar(&force, "force", false, "overwrite an existing file")
	return cmd
}

// trustWritten records trust in the file init just wrote, when it widens
// anything: in written, the bytes init wrote, never in what the file holds
// by the time it is read back (another program writing in the directory
// could have put its own content there in between). Trust is given to the
// bytes read (config.Project.TrustHash), so they must be the ones written.
func (e *env) trustWritten(file string, written []byte) error {
	p, err := config.Load(file)
	if err != nil {
		return err
	}
	defer p.Close()
	if !bytes.Equal(p.Doc.Raw, written) {
		return fmt.Errorf("%s changed between abox init writing it and trusting it (another program writes there), so it is not trusted: read it, then trust it with `abox trust -f %s`, or write it again with `abox init --force`", file, file)
	}
	if len(p.Widenings()) == 0 {
		return nil
	}
	ts, err := e.trustStore()
	if err != nil {
		return err
	}
	return ts.Trust(p)
}

func newUpCmd(e *env) *cobra.Command {
	var file string
	var o project.UpOptions
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "up [-f FILE]",
		Short: "Create (if missing), start and provision the instance an abox.yaml describes",
		Long: `Bring up the instance abox.yaml describes: create it if missing, start it, wait
for SSH and cloud-init, make its allowlist the file's, provision it on the
first boot (in active mode: a request the allowlist refuses is reported with
the entry that would allow it), set the mode and add the forwards.

On an existing instance, up reports drift between the file and the instance,
applies what can change live (allowlist, mode, forwards) and names what needs
a re-create. A file whose settings widen the sandbox (see abox help abox-yaml)
is refused until ` + "`abox trust`" + ` of its exact content.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, m, closeFn, err := e.projectManager(cmd.Context(), file)
			if err != nil {
				return err
			}
			defer closeFn()
			ts, err := e.trustStore()
			if err != nil {
				return err
			}
			a, err := e.access()
			if err != nil {
				return err
			}
			d := project.Deps{Layout: m.Layout, Manager: m, Access: a, Trust: ts, Out: e.stdout, Progress: e.stderr}
			rep, err := project.Up(cmd.Context(), d, p, o)
			var ue *config.UntrustedError
			switch {
			case errors.As(err, &ue):
				return withHint(err, fmt.Sprintf("review those settings, then `abox trust -f %s` to trust this exact content", file))
			case errors.Is(err, project.ErrNotThisProject):
				return err
			case err != nil:
				if rep.Created {
					return withHint(err, fmt.Sprintf("the instance exists now; fix the cause and run `abox up` again, or remove it with `abox down --rm -f %s`", file))
				}
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, rep)
			}
			if len(rep.Drift) > 0 {
				fmt.Fprintf(e.stderr, "%s is up; %d setting(s) differ from %s and need a re-create (abox down --rm && abox up)\n", p.Name, len(rep.Drift), file)
			} else {
				fmt.Fprintf(e.stderr, "%s is up; connect with `abox ssh %s`\n", p.Name, p.Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", config.FileName, "abox.yaml to use")
	cmd.Flags().BoolVar(&o.Provision, "provision", false, "run the provisioning again on an instance already provisioned")
	jsonFlag(cmd.Flags(), &asJSON, "print what up did as JSON")
	return cmd
}

func newDownCmd(e *env) *cobra.Command {
	var file string
	var rm bool
	var so instance.StopOptions
	cmd := &cobra.Command{
		Use:   "down [-f FILE] [--rm]",
		Short: "Stop the instance an abox.yaml describes (--rm: remove it)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, m, closeFn, err := e.projectManager(cmd.Context(), file)
			if err != nil {
				return err
			}
			defer closeFn()
			if err := project.Down(cmd.Context(), m, p, rm, so); err != nil {
				return notFoundHint(p.Name, err)
			}
			if rm {
				fmt.Fprintf(e.stderr, "removed %s\n", p.Name)
			} else {
				fmt.Fprintf(e.stderr, "stopped %s\n", p.Name)
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", config.FileName, "abox.yaml to use")
	cmd.Flags().BoolVar(&rm, "rm", false, "remove the instance and everything abox made for it")
	addStopFlags(cmd, &so)
	return cmd
}

func newTrustCmd(e *env) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "trust [-f FILE]",
		Short: "Trust an abox.yaml's exact content to widen the sandbox",
		Long: `Show the settings of an abox.yaml that widen what the guest may reach or
replace hardened defaults, and record that you trust this exact content (with
the template and CA bundle it names) under the abox data directory, never in
the project. A change that allows more asks again (a name, a rule or a wider
one, another setting); one that only narrows what you trusted does not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := loadProject(file)
			if err != nil {
				return err
			}
			defer p.Close()
			ws := p.Widenings()
			if len(ws) == 0 {
				fmt.Fprintf(e.stderr, "%s widens nothing; no trust needed\n", file)
				return nil
			}
			ts, err := e.trustStore()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "trusting %s, which:\n", p.Path)
			for _, w := range ws {
				fmt.Fprintf(e.stderr, "  %s: %s\n", w.Key, termtext.Clean(w.Why))
			}
			// What is new since the content trusted last is what to read.
			var ue *config.UntrustedError
			if err := ts.Check(p); errors.As(err, &ue) && len(ue.Since) > 0 {
				fmt.Fprintf(e.stderr, "beyond the content trusted at %s, it:\n", ue.TrustedAt.Format(time.RFC3339))
				for _, w := range ue.Since {
					fmt.Fprintf(e.stderr, "  %s: %s\n", w.Key, termtext.Clean(w.Why))
				}
			}
			return ts.Trust(p)
		},
	}
	cmd.Flags().StringVarP(&file, "file", "f", config.FileName, "abox.yaml to trust")
	return cmd
}

func newABoxYAMLHelp() *cobra.Command {
	text, _ := config.Starter("dev", nil)
	return &cobra.Command{
		Use:   "abox-yaml",
		Short: "Reference of abox.yaml (every key, its default and whether it needs trust)",
		Long: "abox.yaml describes a sandbox next to the code; `abox init` writes this file,\n" +
			"`abox up` brings it up. Full reference: docs/abox-yaml.md.\n\n" + text,
	}
}
