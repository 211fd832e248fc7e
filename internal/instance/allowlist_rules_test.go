package instance

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// TestReadAllowlistKeepsRules: the file abox create --allowlist (and abox
// up) seeds an instance from keeps each name's rules: dropping them would
// widen the name to everything on it.
func TestReadAllowlistKeepsRules(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allow.txt")
	os.WriteFile(path, []byte("# seed\nexample.com\napi.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls # pr\n"), 0o600)
	got, err := readAllowlist(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"example.com", "api.github.com GET,HEAD /**", "api.github.com POST /repos/acme/app/pulls"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("seed lines:\n got %q\nwant %q", got, want)
	}
}
