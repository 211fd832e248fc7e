package instance

import (
	"context"
	"testing"

	"github.com/abox-dev/abox/internal/secrets"
)

// TestRemoveForgetsSecretBindings: removing an instance drops its secret
// bindings and placeholders, so that a new instance of the same name does
// not inherit where the values may go; another instance's stay.
func TestRemoveForgetsSecretBindings(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	store := secrets.Open(r.m.Layout.Secrets())
	if err := store.Set("API_KEY", []byte("s3cret-value")); err != nil {
		t.Fatal(err)
	}
	for _, inst := range []string{"dev", "other"} {
		if _, err := store.Bind("API_KEY", secrets.Binding{Instance: inst, Host: "api.example.com", Port: 443, Send: secrets.SendBearer, Header: "Authorization"}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.m.Remove(ctx, "dev", false); err != nil {
		t.Fatal(err)
	}
	if ph, err := store.Placeholders("dev"); err != nil || len(ph) != 0 {
		t.Errorf("placeholders of the removed instance: %v, %v; want none", ph, err)
	}
	if ph, err := store.Placeholders("other"); err != nil || len(ph) != 1 {
		t.Errorf("placeholders of another instance: %v, %v; want its one kept", ph, err)
	}
}
