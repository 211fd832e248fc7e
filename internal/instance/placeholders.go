package instance

import (
	"fmt"

	"github.com/abox-dev/abox/internal/secrets"
)

// placeholders are the placeholders of the secrets bound for instance
// name before it is made (abox up binds abox.yaml's first), for its seed:
// the guest has them in its environment from the first boot. The values
// stay in the store.
func (m *Manager) placeholders(name string) ([][2]string, error) {
	env, err := secrets.Open(m.Layout.Secrets()).Placeholders(name)
	if err != nil {
		return nil, fmt.Errorf("creating %s: secret placeholders: %w", name, err)
	}
	return env, nil
}
