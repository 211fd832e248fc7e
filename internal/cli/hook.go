package cli

import (
	"context"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
)

// newLibvirtHookCmd is what abox's libvirt qemu hook runs (libvirtd calls
// it as root before starting an abox domain, the domain XML on stdin);
// hidden, since no one runs it by hand.
func newLibvirtHookCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:    "libvirt-hook DOMAIN OPERATION SUBOPERATION EXTRA",
		Short:  "Refuse to start an abox guest whose host chains or filters are down (run by libvirtd)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] != "prepare" || args[2] != "begin" {
				return nil
			}
			h := instance.HookChecker{Firewall: hostfw.New(hostfw.ExecRunner{})}
			return h.RunHook(cmd.Context(), e.stdin)
		},
	}
}

// runGuard runs the instance's host-side guard (chains, ARP switches, the
// guest's tap on its bridge, serial log) until ctx ends; it is part of the supervisor.
func runGuard(ctx context.Context, e *env, l paths.Layout, name string) {
	log := slog.New(slog.NewJSONHandler(e.stderr, nil))
	fw := hostfw.New(hostfw.ExecRunner{})
	g := instance.Guard{Layout: l, Name: name, Firewall: fw, Ports: fw, Log: log}
	if hv, err := libvirt.Dial(ctx, libvirtSocket()); err != nil {
		log.Error("guard: libvirtd out of reach; a host firewall that cannot be repaired will not take the guest's link down", "instance", name, "error", err.Error())
	} else {
		defer hv.Close()
		g.Hypervisor = hv
	}
	g.Run(ctx)
}
