package cli

import (
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/validate"
)

// The groups `abox --help` lists commands under, in this order.
var commandGroups = []*cobra.Group{
	{ID: "instances", Title: "Instances:"},
	{ID: "access", Title: "Files and access:"},
	{ID: "policy", Title: "Filters and policy:"},
	{ID: "images", Title: "Images:"},
	{ID: "diagnostics", Title: "Diagnostics:"},
}

// commandGroup places every visible top-level command in a group; a test
// holds new commands to it.
var commandGroup = map[string]string{
	"create": "instances", "start": "instances", "stop": "instances", "restart": "instances",
	"remove": "instances", "list": "instances", "status": "instances", "export": "instances",
	"import": "instances", "snapshot": "instances", "init": "instances", "up": "instances",
	"down": "instances", "fork": "instances", "pool": "instances",

	"ssh": "access", "scp": "access", "provision": "access", "forward": "access",
	"mount": "access", "unmount": "access",

	"allowlist": "policy", "net": "policy", "explain": "policy", "secret": "policy",
	"trust": "policy", "dns": "policy", "http": "policy", "abox-yaml": "policy",

	"base": "images",

	"doctor": "diagnostics", "check-deps": "diagnostics", "tap": "diagnostics",
	"monitor": "diagnostics", "metrics": "diagnostics", "audit": "diagnostics",
	"version": "diagnostics",
}

// notInstanceNames are the command trees whose NAME is not an instance's
// (a base image's, a secret's).
var notInstanceNames = map[string]bool{"abox base": true, "abox secret": true}

// groupCommands gives root its groups and each child its group, and
// completes instance (and snapshot) names wherever a command's first
// argument is one.
func groupCommands(e *env, root *cobra.Command) {
	root.AddGroup(commandGroups...)
	root.SetHelpCommandGroupID("diagnostics")
	root.SetCompletionCommandGroupID("diagnostics")
	for _, c := range root.Commands() {
		if g, ok := commandGroup[c.Name()]; ok {
			c.GroupID = g
		}
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if notInstanceNames[c.CommandPath()] || c.Hidden {
			return
		}
		if c.ValidArgsFunction == nil {
			if f := e.completion(c.Use); f != nil {
				c.ValidArgsFunction = f
			}
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// completion is the completer for a command whose usage line is use: its
// first argument an instance NAME, and a SNAPSHOT after it.
func (e *env) completion(use string) cobra.CompletionFunc {
	f := strings.Fields(use)
	if len(f) < 2 || !strings.HasPrefix(f[1], "NAME") {
		return nil
	}
	snapshot := len(f) > 2 && strings.HasPrefix(f[2], "SNAPSHOT")
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		switch {
		case len(args) == 0:
			return e.instanceNames(toComplete), cobra.ShellCompDirectiveNoFileComp
		case len(args) == 1 && snapshot:
			return e.snapshotNames(cmd, args[0], toComplete), cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}

// instanceNames lists the instances on disk whose names start with
// prefix. It reads directory names only: completion never reaches
// libvirt or a daemon.
func (e *env) instanceNames(prefix string) []cobra.Completion {
	l, err := e.layout()
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir(l.Instances())
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, d := range ents {
		if d.IsDir() && strings.HasPrefix(d.Name(), prefix) && validate.InstanceName(d.Name()) == nil {
			out = append(out, d.Name())
		}
	}
	sort.Strings(out)
	return out
}

// snapshotNames lists the snapshots of instance name, from libvirt.
func (e *env) snapshotNames(cmd *cobra.Command, name, prefix string) []cobra.Completion {
	if validate.InstanceName(name) != nil {
		return nil
	}
	m, closeFn, err := e.readManager(cmd.Context())
	if err != nil {
		return nil
	}
	defer closeFn()
	snaps, err := m.Snapshots(cmd.Context(), name)
	if err != nil {
		return nil
	}
	var out []cobra.Completion
	for _, s := range snaps {
		if strings.HasPrefix(s.Name, prefix) {
			out = append(out, s.Name)
		}
	}
	return out
}
