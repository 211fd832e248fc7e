package instance

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/secrets"
)

// isoSeeds writes the real seed, as abox's own seed writer does (the
// rendered documents packed by genisoimage), so a test reads what the
// guest gets.
type isoSeeds struct{}

func (isoSeeds) WriteSeed(ctx context.Context, path string, in SeedInput) error {
	s, err := cloudinit.Render(in.CloudInit())
	if err != nil {
		return err
	}
	return cloudinit.WriteISO(ctx, cloudinit.ExecRunner{}, s, path)
}

// TestBoundSecretReachesTheSeedAsAPlaceholderOnly: a secret bound for an
// instance before it is made (abox up binds abox.yaml's first) is in its
// seed as the placeholder, so the guest has it from the first boot; after
// the secret is used, neither the export archive (its decompressed
// stream, every entry) nor any file abox wrote outside the value file
// holds the value.
func TestBoundSecretReachesTheSeedAsAPlaceholderOnly(t *testing.T) {
	if _, err := exec.LookPath("genisoimage"); err != nil {
		t.Skip("genisoimage not installed (apt-get install genisoimage)")
	}
	r := archiveRig(t)
	r.m.Seeds = isoSeeds{}
	ctx := context.Background()
	raw := make([]byte, 16)
	rand.Read(raw)
	value := "sk-export-" + hex.EncodeToString(raw)
	store := secrets.Open(r.m.Layout.Secrets())
	if err := store.Set("API_KEY", []byte(value+"\n")); err != nil {
		t.Fatal(err)
	}
	b, err := secrets.ParseBinding(secrets.BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true, Rules: []string{"POST /v1/**"}})
	if err != nil {
		t.Fatal(err)
	}
	ph, err := store.Bind("API_KEY", b)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.m.Create(ctx, Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	f := r.m.Layout.Instance("dev")
	seed, err := os.ReadFile(f.Seed)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"export API_KEY=" + ph + "\n", "API_KEY=" + ph + "\n"} {
		if !bytes.Contains(seed, []byte(want)) {
			t.Errorf("the seed lacks %q: the guest would not have its placeholder from the first boot", want)
		}
	}

	// Used as the proxy uses it: read at the request, its use recorded.
	if v, err := store.Value(ctx, "API_KEY"); err != nil || string(v) != value {
		t.Fatalf("value = %v", err)
	}
	if err := store.MarkUsed("API_KEY", time.Now()); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "dev.abox")
	if _, err := r.m.Export(ctx, "dev", out); err != nil {
		t.Fatal(err)
	}
	arc, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(arc))
	if err != nil {
		t.Fatal(err)
	}
	stream, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(arc, []byte(value)) || bytes.Contains(stream, []byte(value)) {
		t.Errorf("the export archive holds the value")
	}

	valueFile := filepath.Join(r.m.Layout.Secrets(), "values", "API_KEY")
	seen := false
	for _, root := range []string{r.m.Layout.Root, filepath.Dir(out)} {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if !bytes.Contains(b, []byte(value)) {
				return nil
			}
			if p == valueFile {
				seen = true
				return nil
			}
			t.Errorf("%s holds the value", p)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !seen {
		t.Errorf("the search did not find the value in its own file %s: it proves nothing", valueFile)
	}
}
