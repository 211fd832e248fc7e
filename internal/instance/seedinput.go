package instance

import (
	"fmt"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/secrets"
)

// CloudInit is the cloud-init configuration of the seed in describes: the
// one mapping from an instance to what its guest gets at the first boot.
func (in SeedInput) CloudInit() cloudinit.Config {
	st := in.State
	return cloudinit.Config{
		Name: st.Name, UUID: st.UUID, User: st.User,
		AuthorizedKey: in.AuthorizedKey, CACertPEM: string(in.CACertPEM),
		MAC: st.MAC, Subnet: st.Subnet, GuestIP: st.GuestIP, Gateway: st.Gateway, ProxyPort: st.ProxyPort,
		HostKeyPEM: string(in.HostKeyPEM), HostPublicKey: in.HostPublicKey,
		Monitor: st.Monitor, Placeholders: in.Placeholders,
	}
}

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
