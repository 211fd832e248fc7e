package instance

import (
	"context"

	"github.com/abox-dev/abox/internal/steps"
)

// runSteps runs an operation's steps (see internal/steps): errors begin
// with prefix once, every event goes to m.OnStep, and a failing step
// undoes the completed ones in reverse.
func (m *Manager) runSteps(ctx context.Context, prefix string, list []steps.Step) ([]steps.Timing, error) {
	if m.faultBefore != nil {
		for i := range list {
			s := list[i]
			do, name := s.Do, s.Name
			list[i].Do = func(ctx context.Context) error {
				if err := m.faultBefore(name); err != nil {
					return err
				}
				return do(ctx)
			}
		}
	}
	return steps.Runner{Prefix: prefix, Progress: m.OnStep}.Run(ctx, list)
}
