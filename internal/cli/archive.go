package cli

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/validate"
)

func newExportCmd(e *env) *cobra.Command {
	var out string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "export NAME [-o FILE]",
		Short: "Write a stopped instance to an archive file",
		Long: `Export writes a stopped instance to one archive (gzip-compressed tar): its
settings, allowlist, CA and SSH keys, the files its settings name, and its disk
flattened onto its base image, so the archive imports without the base. The
archive holds private keys and is written 0600; treat it as a secret. It
appears only when complete. A running instance is refused: stop it first.`,
		Example: `  abox stop dev && abox export dev -o dev.abox`,
		Args:    exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validate.InstanceName(args[0]); err != nil {
				return usageError{err}
			}
			if out == "" {
				out = args[0] + ".abox"
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			res, err := m.Export(cmd.Context(), args[0], out)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, res)
			}
			fmt.Fprintf(e.stderr, "exported %s to %s: %.1f MiB (disk %.1f MiB flattened) in %s\n", args[0], res.Path, float64(res.Size)/(1<<20), float64(res.DiskBytes)/(1<<20), res.Duration.Round(time.Second/10))
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "archive file to write (default NAME.abox; must not exist)")
	jsonFlag(cmd.Flags(), &asJSON, "print the result as JSON")
	return cmd
}

func newImportCmd(e *env) *cobra.Command {
	var o instance.ImportOptions
	cmd := &cobra.Command{
		Use:   "import FILE [--name NEW]",
		Short: "Create an instance from an archive written by abox export",
		Long: `Import reads an archive as untrusted input: only the entries abox export
writes, regular files of the sizes its manifest gives, a manifest of a version
this abox reads, and a standalone qcow2 or raw disk (no backing file, no
external data file). Settings that widen the sandbox beyond a fresh
` + "`abox create`" + ` (an allowlist, MITM off or exceptions, private ranges, extra
ports, other resolvers, an upstream proxy or CA, a domain template, the monitor,
more CPUs, memory or disk) are listed and need --trust. The network (subnet, bridge, MAC)
is allocated fresh. An upstream proxy's credentials file is a path on the
exporting host and is never read: name this host's with
--upstream-proxy-credentials. A failed import leaves nothing behind.`,
		Example: `  abox import dev.abox --name dev2
  abox import dev.abox --name dev2 --trust`,
		Args: exactArgs(1, "an archive FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.Name != "" {
				if err := validate.InstanceName(o.Name); err != nil {
					return usageError{fmt.Errorf("--name: %w", err)}
				}
			}
			m, closeFn, err := e.manager(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			st, warnings, err := m.Import(cmd.Context(), args[0], o)
			for _, w := range warnings {
				fmt.Fprintf(e.stderr, "warning: %s\n", w)
			}
			var we *instance.WideningError
			if errors.As(err, &we) {
				return withHint(err, "the settings above came with the archive; a fresh `abox create` has none of them")
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "imported %s (%s, guest %s); start it with `abox start %s`\n", st.Name, st.Subnet, st.GuestIP, st.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.Name, "name", "", "name of the new instance (default: the archive's)")
	cmd.Flags().BoolVar(&o.Trust, "trust", false, "accept the archive's settings that widen the sandbox (they are listed without it)")
	cmd.Flags().StringVar(&o.UpstreamProxyCredentials, "upstream-proxy-credentials", "", "FILE on this host holding the archive's upstream proxy's USER:PASSWORD (the archive's own path, one on the exporting host, is never read)")
	return cmd
}
