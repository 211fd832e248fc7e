package image

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestSigner is a throwaway OpenPGP key made with the real gpg, in a home
// of its own: Keyring is its public key as a keyring file (what a keyring
// package installs), Sign makes a detached armored signature.
type TestSigner struct {
	t           *testing.T
	home        string
	Keyring     string
	Fingerprint string
}

// NewTestSigner generates a signing-only ed25519 key.
func NewTestSigner(t *testing.T, uid string) *TestSigner {
	t.Helper()
	need.Program(t, "gpg")
	need.Program(t, GPGV)
	// A short home: gpg-agent's socket path must fit a sockaddr_un.
	home, err := os.MkdirTemp("", "abox-gpg-")
	if err != nil {
		t.Fatal(err)
	}
	g := &TestSigner{t: t, home: home}
	t.Cleanup(func() {
		cmd := exec.Command("gpgconf", "--kill", "gpg-agent")
		cmd.Env = append(os.Environ(), "GNUPGHOME="+home)
		cmd.Run()
		os.RemoveAll(home)
	})
	g.gpg("--quick-gen-key", uid, "ed25519", "sign", "never")
	for _, line := range strings.Split(g.gpg("--with-colons", "--list-keys", uid), "\n") {
		if f := strings.Split(line, ":"); len(f) > 9 && f[0] == "fpr" && g.Fingerprint == "" {
			g.Fingerprint = f[9]
		}
	}
	if g.Fingerprint == "" {
		t.Fatal("gpg made a key without a fingerprint")
	}
	g.Keyring = filepath.Join(t.TempDir(), "keyring.gpg")
	g.gpg("--output", g.Keyring, "--export", g.Fingerprint)
	return g
}

func (g *TestSigner) gpg(args ...string) string {
	g.t.Helper()
	cmd := exec.Command("gpg", append([]string{"--batch", "--yes", "--pinentry-mode", "loopback", "--passphrase", ""}, args...)...)
	cmd.Env = append(os.Environ(), "GNUPGHOME="+g.home)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		g.t.Fatalf("gpg %v: %v: %s", args, err, stderr)
	}
	return string(out)
}

// Sign returns a detached armored signature of data.
func (g *TestSigner) Sign(data []byte) []byte {
	g.t.Helper()
	dir := g.t.TempDir()
	in, out := filepath.Join(dir, "data"), filepath.Join(dir, "data.asc")
	if err := os.WriteFile(in, data, 0o600); err != nil {
		g.t.Fatal(err)
	}
	g.gpg("--local-user", g.Fingerprint, "--armor", "--output", out, "--detach-sign", in)
	b, err := os.ReadFile(out)
	if err != nil {
		g.t.Fatal(err)
	}
	return b
}

// TestPullCatalogSignature pulls ubuntu-24.04, whose checksum file the
// distribution signs, from a local https mirror, with a throwaway key
// standing in for Ubuntu's: a good signature is accepted and recorded; a
// tampered checksum file, a signature by another key, a missing or empty
// signature and a missing keyring are each refused before the image is
// downloaded, naming the problem, and leave nothing in the store.
func TestPullCatalogSignature(t *testing.T) {
	ctx := context.Background()
	signer := NewTestSigner(t, "abox test signer <signer@abox.invalid>")
	other := NewTestSigner(t, "someone else <other@abox.invalid>")
	body := []byte(strings.Repeat("signed cloud image ", 5000))
	const (
		sumsPath = "/m/noble/current/SHA256SUMS"
		sigPath  = "/m/noble/current/SHA256SUMS.gpg"
		imgPath  = "/m/noble/current/noble-server-cloudimg-amd64.img"
	)
	good := catalogFixture(body)
	for k, v := range good {
		delete(good, k)
		good["/m"+strings.TrimPrefix(k, "/mirror")] = v
	}
	good[sigPath] = signer.Sign(good[sumsPath])
	entry, err := LookupCatalog("ubuntu-24.04")
	if err != nil {
		t.Fatal(err)
	}
	if entry.Signature == nil {
		t.Fatal("ubuntu-24.04 has no signature in the catalogue")
	}

	serve := func(t *testing.T, files map[string][]byte) (*Store, string, func() []string) {
		var mu sync.Mutex
		var requests []string
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			requests = append(requests, r.URL.Path)
			mu.Unlock()
			mirror{files: files}.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
		return s, srv.URL + "/m", func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), requests...) }
	}

	t.Run("good signature", func(t *testing.T) {
		s, m, requests := serve(t, good)
		img, err := s.PullCatalog(ctx, "ubuntu-24.04", entry, CatalogPull{Mirror: m, Keyring: signer.Keyring}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !img.Signed || img.SignedBy != signer.Fingerprint || !strings.Contains(img.Verification(), "signature by "+signer.Fingerprint) {
			t.Errorf("metadata signed=%v by %q, verified %q; want signed by %s", img.Signed, img.SignedBy, img.Verification(), signer.Fingerprint)
		}
		if got, want := strings.Join(requests(), " "), sumsPath+" "+sigPath+" "+imgPath; got != want {
			t.Errorf("requests = %s, want %s (the signature checked before the image is fetched)", got, want)
		}
		stored, err := s.Get("ubuntu-24.04")
		if err != nil || !stored.Signed || stored.SignedBy != signer.Fingerprint {
			t.Errorf("image.json after the pull: %+v %v, want signed by %s", stored.Metadata, err, signer.Fingerprint)
		}
	})

	tampered := func(f map[string][]byte) {
		f[sumsPath] = append([]byte(hexSHA256([]byte("evil"))+" *noble-server-cloudimg-amd64.img\n"), f[sumsPath]...)
	}
	for _, tt := range []struct {
		name    string
		change  func(map[string][]byte)
		keyring string
		want    string
	}{
		{"tampered checksum file", tampered, "", "does not match the checksum file"},
		{"signature by a key not in the keyring", func(f map[string][]byte) { f[sigPath] = other.Sign(f[sumsPath]) }, "", "not in the keyring"},
		{"signature missing", func(f map[string][]byte) { delete(f, sigPath) }, "", "its signature could not be fetched"},
		{"signature not OpenPGP", func(f map[string][]byte) { f[sigPath] = []byte("not a signature\n") }, "", "no OpenPGP signature"},
		{"keyring of the wrong key", nil, other.Keyring, "not in the keyring"},
		{"keyring missing", nil, filepath.Join(t.TempDir(), "absent.gpg"), "is not on this host"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{}
			for k, v := range good {
				files[k] = v
			}
			if tt.change != nil {
				tt.change(files)
			}
			keyring := signer.Keyring
			if tt.keyring != "" {
				keyring = tt.keyring
			}
			s, m, requests := serve(t, files)
			_, err := s.PullCatalog(ctx, "ubuntu-24.04", entry, CatalogPull{Mirror: m, Keyring: keyring}, nil)
			if !errors.Is(err, ErrSignature) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("PullCatalog = %v, want ErrSignature saying %q", err, tt.want)
			}
			for _, r := range requests() {
				if r == imgPath {
					t.Errorf("the image was downloaded although the signature was refused")
				}
			}
			if got := leftovers(t, s); len(got) != 0 {
				t.Errorf("images dir holds %q after a refused pull, want nothing", got)
			}
		})
	}

	t.Run("unsigned on request, and a distribution that signs nothing", func(t *testing.T) {
		files := map[string][]byte{}
		for k, v := range good {
			files[k] = v
		}
		delete(files, sigPath)
		s, m, _ := serve(t, files)
		img, err := s.PullCatalog(ctx, "ubuntu-24.04", entry, CatalogPull{Mirror: m, Unsigned: true}, nil)
		if err != nil || img.Signed || !strings.Contains(img.Verification(), "checksum not signature-checked: pulled with --unsigned") {
			t.Errorf("--unsigned pull = %v, signed=%v, verified %q", err, img.Signed, img.Verification())
		}
		deb, _ := LookupCatalog("debian-12")
		img, err = s.PullCatalog(ctx, "debian-12", deb, CatalogPull{Mirror: m}, nil)
		if err != nil || img.Signed || !strings.Contains(img.Verification(), "checksum not signature-checked: "+debianUnsigned) {
			t.Errorf("debian-12 pull = %v, signed=%v, verified %q", err, img.Signed, img.Verification())
		}
		if _, err := s.PullCatalog(ctx, "debian-x", deb, CatalogPull{Mirror: m, Keyring: signer.Keyring}, nil); err == nil || !strings.Contains(err.Error(), "no signature to check") {
			t.Errorf("a keyring for an unsigned entry = %v, want refused", err)
		}
	})
}
