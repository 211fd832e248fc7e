package project

import (
	"context"
	"fmt"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/instance"
)

// Down stops the file's instance, or with rm removes it (forwards, mounts,
// libvirt objects, firewall chain and files).
func Down(ctx context.Context, m *instance.Manager, p *config.Project, rm bool, o instance.StopOptions) error {
	if _, err := instance.Load(m.Layout, p.Name); err != nil {
		return err
	}
	// A repository's file must not stop or delete an instance it did not
	// make just by naming it.
	bd, ok, err := loadBinding(m.Layout, p.Name)
	if err != nil {
		return err
	}
	if !ok || bd.File != p.Path {
		return fmt.Errorf("down %s: instance %s: %w (use abox stop or abox remove for it)", p.Path, p.Name, ErrNotThisProject)
	}
	if rm {
		return m.Remove(ctx, p.Name, true)
	}
	return m.Stop(ctx, p.Name, o)
}
