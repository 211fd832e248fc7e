package cli

import (
	"context"
	"fmt"
	"os/exec"
	"strings"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/doctor"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/limitio"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
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
	jsonFlag(cmd.Flags(), &asJSON, "")
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

func newDoctorCmd(e *env) *cobra.Command {
	var asJSON, noGuest bool
	var probeIP, probeResolver string
	cmd := &cobra.Command{
		Use:   "doctor NAME",
		Short: "Check every isolation layer of a running instance, then probe from inside it",
		Long: `Check each layer of a running instance from the host: the domain runs; the
nwfilter is defined as abox builds it, referenced by the persistent domain
definition and bound to the live interface; the host chains are present,
intact and ahead of every other rule; the filter daemon's API answers, its
mode and allowlist; the DNS filter and the proxy answer on the gateway; the
logs are writable. Then, over SSH, negative probes from inside the guest: a
name off the allowlist gets NXDOMAIN, a URL off it gets 403, private and
metadata addresses through the proxy are refused, a direct connection and a
ping to a public address fail, a third-party resolver is unreachable, the
gateway's other ports are closed; and the guest trusts the instance CA.

One line per check with the fix for each failure. Exit status 1 when a layer
is broken. The probes prove what ordinary software in the guest can reach;
a guest that is already compromised can lie about them, the host-side
checks it cannot.`,
		Args: exactArgs(1, "an instance NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			name := args[0]
			if err := validate.InstanceName(name); err != nil {
				return usageError{err}
			}
			l, err := e.layout()
			if err != nil {
				return err
			}
			st, err := instance.Load(l, name)
			if err != nil {
				return notFoundHint(name, err)
			}
			hv, err := libvirt.Dial(ctx, libvirtSocket())
			if err != nil {
				return withHint(err, "start libvirtd (`libvirtd -d`) and run abox as root; `abox check-deps` checks the host")
			}
			defer hv.Close()
			filter, err := libvirt.BuildNWFilter(instance.ParamsOf(l, st))
			if err != nil {
				return err
			}
			files := l.Instance(name)
			in := doctor.Instance{
				State: st, Files: files, Filter: filter,
				Hypervisor: hv, Firewall: hostfw.New(hostfw.ExecRunner{}),
				Filters: api.NewClient(files.APISocket),
				ProbeIP: probeIP, ProbeResolver: probeResolver,
			}
			if !noGuest {
				in.Guest = sshScript(l, st)
			}
			return e.renderReport(doctor.Doctor(ctx, in), asJSON)
		},
	}
	f := cmd.Flags()
	jsonFlag(f, &asJSON, "")
	f.BoolVar(&noGuest, "no-guest", false, "skip the probes from inside the guest")
	f.StringVar(&probeIP, "probe-ip", doctor.DefaultProbeIP, "public address the guest must not reach directly")
	f.StringVar(&probeResolver, "probe-resolver", doctor.DefaultProbeResolver, "third-party resolver the guest must not reach")
	return cmd
}

// sshScript runs a shell script in the guest: sh reads it from stdin, so no
// quoting passes through ssh's command line.
func sshScript(l paths.Layout, st instance.State) doctor.Guest {
	return func(ctx context.Context, script string) ([]byte, error) {
		argv, err := instance.SSHArgs(l, st, []string{"sh", "-s"})
		if err != nil {
			return nil, err
		}
		c := exec.CommandContext(ctx, "ssh", argv...)
		c.Stdin = strings.NewReader(script)
		// The guest answers; it may answer without end.
		stdout := &limitio.Buffer{Max: doctor.MaxGuestOutput, Fail: true}
		stderr := &limitio.Buffer{Max: 64 << 10}
		c.Stdout, c.Stderr = stdout, stderr
		err = c.Run()
		out := stdout.Bytes()
		if stdout.Over() {
			return nil, fmt.Errorf("ssh %s: the guest's answer passed %d bytes", st.Name, doctor.MaxGuestOutput)
		}
		if err != nil && len(out) == 0 {
			return out, fmt.Errorf("ssh %s: %w: %s", st.Name, err, strings.TrimSpace(string(stderr.Bytes())))
		}
		return out, nil
	}
}
