package project

import (
	"context"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/secrets"
)

const secretsYAML = `version: 1
name: dev
allowlist: [api.example.com, other.example.com]
secrets:
  - {name: API_KEY, host: api.example.com, bearer: true, rules: ["POST /v1/**"]}
  - {name: OTHER_KEY, host: other.example.com, header: x-api-key}
`

func secretDeps(t *testing.T) (Deps, *secrets.Store) {
	t.Helper()
	l := paths.Layout{Root: t.TempDir()}
	m := &instance.Manager{Layout: l, Images: image.NewStore(l.Root, nil, nil)}
	d := Deps{Layout: l, Manager: m, Trust: config.TrustStore{Dir: filepath.Join(l.Root, "trust")}, Out: io.Discard, Progress: io.Discard}
	return d, secrets.Open(l.Secrets())
}

func trusted(t *testing.T, d Deps, yaml string) *config.Project {
	t.Helper()
	p := loadProject(t, yaml, map[string]string{})
	if err := d.Trust.Trust(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestUpRefusesAnUnstoredSecret: a binding of a secret the host's store
// does not hold fails at the item's line, saying how to store it, before
// anything is made or bound.
func TestUpRefusesAnUnstoredSecret(t *testing.T) {
	d, store := secretDeps(t)
	if err := store.Set("API_KEY", []byte("v-123")); err != nil {
		t.Fatal(err)
	}
	p := trusted(t, d, secretsYAML)
	_, err := Up(context.Background(), d, p, UpOptions{})
	want := p.Path + ":6:12: secrets[1].name: OTHER_KEY is not in the host's secret store; store its value on the host with `abox secret set OTHER_KEY`"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("up = %v\nwant %q", err, want)
	}
	if ph, _ := store.Placeholders("dev"); len(ph) != 0 {
		t.Errorf("placeholders made before the refusal: %v", ph)
	}
	if _, err := instance.Load(d.Layout, "dev"); err == nil {
		t.Error("an instance was made")
	}
}

// TestUpUndoesBindingsWhenCreateFails: up binds the file's secrets before
// it creates (the seed needs the placeholders); a create that fails takes
// them away again, and leaves another instance's alone.
func TestUpUndoesBindingsWhenCreateFails(t *testing.T) {
	d, store := secretDeps(t)
	for _, n := range []string{"API_KEY", "OTHER_KEY"} {
		if err := store.Set(n, []byte("v-"+n)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Bind("API_KEY", secrets.Binding{Instance: "prod", Host: "api.example.com", Port: 443, Send: secrets.SendBearer, Header: "Authorization"}); err != nil {
		t.Fatal(err)
	}
	// A binding made by hand for the instance before it exists (abox
	// secret bind does not ask for one) is not the failed up's to undo.
	hand := secrets.Binding{Instance: "dev", Host: "hand.example.com", Port: 443, Send: secrets.SendBearer, Header: "Authorization"}
	handPH, err := store.Bind("OTHER_KEY", hand)
	if err != nil {
		t.Fatal(err)
	}
	p := trusted(t, d, secretsYAML)
	if _, err := Up(context.Background(), d, p, UpOptions{}); err == nil || !strings.Contains(err.Error(), "base image") {
		t.Fatalf("up without a base image = %v, want create's error", err)
	}
	if ph, err := store.Placeholders("dev"); err != nil || len(ph) != 1 || ph[0][1] != handPH {
		t.Errorf("placeholders of the instance that was not made: %v, %v; want only the hand binding's %s", ph, err, handPH)
	}
	if ph, err := store.Placeholders("prod"); err != nil || len(ph) != 1 {
		t.Errorf("another instance's placeholders: %v, %v; want its one kept", ph, err)
	}
}

// TestApplySecrets: up makes the store's bindings of the instance the
// file's, says what changed, names the secrets new to the instance, and
// removes only the bindings an earlier up made from the file.
func TestApplySecrets(t *testing.T) {
	_, store := secretDeps(t)
	for _, n := range []string{"API_KEY", "OTHER_KEY", "HAND_KEY"} {
		if err := store.Set(n, []byte("v-"+n)); err != nil {
			t.Fatal(err)
		}
	}
	hand := secrets.Binding{Instance: "dev", Host: "hand.example.com", Port: 443, Send: secrets.SendBearer, Header: "Authorization"}
	if _, err := store.Bind("HAND_KEY", hand); err != nil {
		t.Fatal(err)
	}
	p := loadProject(t, secretsYAML, map[string]string{})
	applied, bound, fresh, err := applySecrets(store, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantBound := []boundSecret{{"API_KEY", "api.example.com"}, {"OTHER_KEY", "other.example.com"}}
	if len(applied) != 2 || !slices.Equal(bound, wantBound) || !slices.Equal(fresh, []string{"API_KEY", "OTHER_KEY"}) {
		t.Fatalf("first apply: applied %q, bound %v, fresh %v", applied, bound, fresh)
	}
	env, _ := store.Placeholders("dev")
	if len(env) != 3 {
		t.Fatalf("placeholders = %v, want the file's two and the hand-made one", env)
	}

	applied, bound, fresh, err = applySecrets(store, p, bound)
	if err != nil || len(applied) != 0 || len(fresh) != 0 || !slices.Equal(bound, wantBound) {
		t.Errorf("second apply of the same file: applied %q, bound %v, fresh %v, %v; want nothing changed", applied, bound, fresh, err)
	}

	// Narrowed: one binding's rule, the other gone.
	narrow := loadProject(t, strings.Replace(strings.Replace(secretsYAML, "/v1/**", "/v1/chat", 1),
		"  - {name: OTHER_KEY, host: other.example.com, header: x-api-key}\n", "", 1), map[string]string{})
	applied, bound, fresh, err = applySecrets(store, narrow, bound)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(applied, []string{"secret dev -> api.example.com [POST /v1/chat] as Authorization: Bearer (API_KEY)", "secret OTHER_KEY unbound from other.example.com"}) ||
		!slices.Equal(bound, wantBound[:1]) || len(fresh) != 0 {
		t.Errorf("narrowing apply: applied %q, bound %v, fresh %v", applied, bound, fresh)
	}
	list, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, in := range list {
		for _, b := range in.Bindings {
			got = append(got, in.Name+": "+b.String())
		}
	}
	want := []string{"API_KEY: dev -> api.example.com [POST /v1/chat] as Authorization: Bearer", "HAND_KEY: " + hand.String()}
	if !slices.Equal(got, want) {
		t.Errorf("bindings after narrowing:\n got %q\nwant %q", got, want)
	}
	// A binding an earlier up made and that is gone already (abox secret
	// rm, or unbind by hand) is no error.
	if _, _, _, err := applySecrets(store, narrow, append(bound, boundSecret{"GONE_KEY", "gone.example.com"}, boundSecret{"HAND_KEY", "other.example.com"})); err != nil {
		t.Errorf("apply with bindings gone already: %v", err)
	}
	env2, _ := store.Placeholders("dev")
	if env2[0] != env[0] {
		t.Errorf("a re-bound secret's placeholder changed from %v to %v: the guest's would no longer work", env[0], env2[0])
	}
}
