package cli

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/doctor"
	"github.com/abox-dev/abox/internal/libvirt"
)

func newCheckDepsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check-deps",
		Short: "Check the host tools and kernel features abox needs, with the command that fixes each",
		Long: `Check libvirtd, QEMU, qemu-img, the seed ISO tool, iptables/ebtables and their
backends, KVM (usable or not, and why), bridge netfilter, tcpdump, the image
build tools and free disk space. Each problem comes with the command that
fixes it. Exit status 1 when something abox needs is missing; warnings
(TCG instead of KVM, optional tools) do not count.`,
		Args: exactArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.layout()
			if err != nil {
				return err
			}
			dial := func(ctx context.Context) error {
				c, err := libvirt.Dial(ctx, libvirtSocket())
				if err != nil {
					return err
				}
				return c.Close()
			}
			r := doctor.CheckDeps(cmd.Context(), doctor.DefaultHost(l.Root, dial))
			return e.renderReport(r, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// renderReport prints a report and turns a failure into exit status 1.
func (e *env) renderReport(r doctor.Report, asJSON bool) error {
	if asJSON {
		if err := writeJSON(e.stdout, r); err != nil {
			return err
		}
	} else {
		r.Render(e.stdout)
	}
	if r.Failed() {
		return exitCodeError{code: exitError}
	}
	return nil
}
