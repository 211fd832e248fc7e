//go:build e2e

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// The Tetragon bundle the VM suite runs by default: the one kept beside the
// repository, in ../shared/tetragon (its README says how it was built, from
// which commit, and under which licences). CI's clean clone has it next to
// it too, since CI's machines can neither download nor build one.
const (
	sharedBundleDir     = "shared/tetragon"
	sharedBundleName    = "tetragon-v1.7-ff580d1-amd64.tar.gz"
	sharedBundleSHA256  = "bb4894bb997fa58e254751b3bf88e89400e03be7a33f3b2ca8a64dbdaf5d8325"
	sharedBundleVersion = "v1.7-ff580d1"
)

// tetragonBundle is the bundle TestTetragonAgent installs, and the version
// its agent must report ("" when the test cannot know it: any release
// version then). ABOX_TETRAGON_BUNDLE overrides the shared bundle
// (ABOX_TETRAGON_VERSION names its version). Without either the test is
// skipped, except under CI=true, where it fails like the suite's other
// needs; the shared bundle is used only if its sha256 is the pinned one.
func tetragonBundle(t *testing.T) (file, version string) {
	t.Helper()
	if f := os.Getenv("ABOX_TETRAGON_BUNDLE"); f != "" {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("ABOX_TETRAGON_BUNDLE: %v", err)
		}
		return f, os.Getenv("ABOX_TETRAGON_VERSION")
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	f, searched, err := findSharedBundle(wd, sharedBundleName, sharedBundleSHA256)
	if err != nil {
		t.Fatalf("%v: restore it, or name another bundle with ABOX_TETRAGON_BUNDLE", err)
	}
	if f == "" {
		needVM(t, fmt.Sprintf("no Tetragon bundle: ABOX_TETRAGON_BUNDLE is not set and %s is in none of %q", sharedBundleName, searched))
	}
	t.Logf("tetragon bundle: %s (sha256 %s)", f, sharedBundleSHA256)
	return f, sharedBundleVersion
}

// findSharedBundle looks for shared/tetragon/NAME next to the module root
// (from, or the first directory above it that holds go.mod) and next to
// each directory above that, so that a clone, a worktree or CI's checkout
// beside ../shared all find it. It returns "" and the directories searched
// when there is none, and an error when the one found is not of digest
// sha.
func findSharedBundle(from, name, sha string) (file string, searched []string, err error) {
	root := from
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		up := filepath.Dir(root)
		if up == root {
			return "", nil, fmt.Errorf("no go.mod in %s or above", from)
		}
		root = up
	}
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		d := filepath.Join(dir, sharedBundleDir)
		searched = append(searched, d)
		f := filepath.Join(d, name)
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() {
			sum, err := fileSHA256(f)
			if err != nil {
				return "", searched, fmt.Errorf("the shared Tetragon bundle: %v", err)
			}
			if sum != sha {
				return "", searched, fmt.Errorf("the shared Tetragon bundle %s has sha256 %s, want %s (the bundle its README describes)", f, sum, sha)
			}
			return f, searched, nil
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", searched, err
		}
		if filepath.Dir(dir) == dir {
			return "", searched, nil
		}
	}
}

func fileSHA256(name string) (string, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
