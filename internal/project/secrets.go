package project

import (
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/secrets"
)

// boundSecret is a binding up made from the file, recorded in project.json
// so that a later up removes it when the file no longer names it (and
// leaves bindings made with abox secret bind alone).
type boundSecret struct {
	Name string `json:"name"`
	// Host is the binding's host, with ":PORT" when not 443 (the form
	// Store.Unbind takes).
	Host string `json:"host"`
}

func boundOf(s config.Secret) boundSecret {
	h := s.Binding.Host
	if s.Binding.Port != secrets.DefaultPort {
		h += ":" + strconv.Itoa(int(s.Binding.Port))
	}
	return boundSecret{Name: s.Name, Host: h}
}

// checkSecretsStored refuses a file that binds a secret the host's store
// does not hold, at the item's line, before anything is made.
func checkSecretsStored(store *secrets.Store, p *config.Project) error {
	if len(p.Secrets) == 0 {
		return nil
	}
	list, err := store.List()
	if err != nil {
		return fmt.Errorf("up %s: %w", p.Path, err)
	}
	have := map[string]bool{}
	for _, in := range list {
		have[in.Name] = true
	}
	var errs []error
	for _, s := range p.Secrets {
		if !have[s.Name] {
			errs = append(errs, p.SecretError(s, "%s is not in the host's secret store; store its value on the host with `abox secret set %s` (abox secret list shows the stored ones)", s.Name, s.Name))
		}
	}
	return errors.Join(errs...)
}

// applySecrets makes the store's bindings of the instance from the file
// what p says: each of p's bindings bound (a binding of the same secret,
// host and port replaced), and each one an earlier up made from the file
// (prev) that p no longer names removed. It returns what changed, the
// bindings now made from the file, and the secrets newly bound for the
// instance (whose placeholders a guest already running does not have).
func applySecrets(store *secrets.Store, p *config.Project, prev []boundSecret) (applied []string, now []boundSecret, fresh []string, err error) {
	before, err := store.Placeholders(p.Name)
	if err != nil {
		return nil, prev, nil, err
	}
	had := map[string]bool{}
	for _, kv := range before {
		had[kv[0]] = true
	}
	list, err := store.List()
	if err != nil {
		return nil, prev, nil, err
	}
	same := func(name string, b secrets.Binding) bool {
		for _, in := range list {
			if in.Name == name && slices.ContainsFunc(in.Bindings, func(o secrets.Binding) bool { return slices.Equal(o.Rules, b.Rules) && o.String() == b.String() }) {
				return true
			}
		}
		return false
	}
	for _, s := range p.Secrets {
		now = append(now, boundOf(s))
		if same(s.Name, s.Binding) {
			continue
		}
		if _, err := store.Bind(s.Name, s.Binding); err != nil {
			return applied, append(prev, now...), fresh, fmt.Errorf("up %s: %s: %w", p.Name, s.Key, err)
		}
		applied = append(applied, "secret "+s.Binding.String()+" ("+s.Name+")")
		if !had[s.Name] && !slices.Contains(fresh, s.Name) {
			fresh = append(fresh, s.Name)
		}
	}
	for _, b := range prev {
		if slices.Contains(now, b) {
			continue
		}
		err := store.Unbind(b.Name, p.Name, b.Host)
		switch {
		case err == nil:
			applied = append(applied, "secret "+b.Name+" unbound from "+b.Host)
		case errors.Is(err, secrets.ErrNotFound) || !stillBound(store, b, p.Name):
			// Gone already (abox secret rm or unbind by hand): as wanted.
		default:
			return applied, append(now, b), fresh, fmt.Errorf("up %s: unbinding %s from %s: %w", p.Name, b.Name, b.Host, err)
		}
	}
	return applied, now, fresh, nil
}

// bindingsOf lists the store's bindings of instance.
func bindingsOf(store *secrets.Store, instance string) ([]boundSecret, error) {
	list, err := store.List()
	if err != nil {
		return nil, err
	}
	var out []boundSecret
	for _, in := range list {
		for _, o := range in.Bindings {
			if o.Instance == instance {
				out = append(out, boundOf(config.Secret{Name: in.Name, Binding: o}))
			}
		}
	}
	return out, nil
}

// unbindNew removes the bindings of instance that are not in prior: what
// an up that failed had bound.
func unbindNew(store *secrets.Store, instance string, prior []boundSecret) error {
	now, err := bindingsOf(store, instance)
	if err != nil {
		return err
	}
	var errs []error
	for _, b := range now {
		if !slices.Contains(prior, b) {
			if err := store.Unbind(b.Name, instance, b.Host); err != nil {
				errs = append(errs, fmt.Errorf("rolling back binding %s to %s: %w", b.Name, b.Host, err))
			}
		}
	}
	return errors.Join(errs...)
}

// stillBound reports whether the store still has binding b of instance.
func stillBound(store *secrets.Store, b boundSecret, instance string) bool {
	list, err := store.List()
	if err != nil {
		return true
	}
	for _, in := range list {
		if in.Name != b.Name {
			continue
		}
		for _, o := range in.Bindings {
			if o.Instance == instance && boundOf(config.Secret{Name: in.Name, Binding: o}) == b {
				return true
			}
		}
	}
	return false
}
