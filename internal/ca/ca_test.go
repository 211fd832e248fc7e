package ca

import (
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newCA(t *testing.T, cfg Config) *CA {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(t.TempDir(), "ca")
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCreatedOnFirstUse(t *testing.T) {
	c := newCA(t, Config{})
	if _, err := os.Stat(c.cfg.Dir); err == nil {
		t.Fatal("New wrote the CA before first use")
	}
	if _, err := c.Leaf("example.com"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{"", 0o700}, {KeyFile, 0o600}, {CertFile, 0o644}} {
		st, err := os.Stat(filepath.Join(c.cfg.Dir, f.name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != f.mode {
			t.Errorf("%s mode %v, want %v", filepath.Join(c.cfg.Dir, f.name), st.Mode().Perm(), f.mode)
		}
	}
	cert, _ := c.Certificate()
	if cert.PublicKeyAlgorithm != x509.ECDSA || !cert.IsCA || cert.NotAfter.Sub(cert.NotBefore) > 91*24*time.Hour {
		t.Errorf("CA: alg %v, IsCA %v, validity %v", cert.PublicKeyAlgorithm, cert.IsCA, cert.NotAfter.Sub(cert.NotBefore))
	}
	// A second CA on the same directory loads the same certificate.
	c2 := newCA(t, Config{Dir: c.cfg.Dir})
	cert2, err := c2.Certificate()
	if err != nil || !cert2.Equal(cert) {
		t.Errorf("reloaded CA differs (%v)", err)
	}
}

func TestLeafVerifies(t *testing.T) {
	c := newCA(t, Config{})
	root, err := c.Certificate()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(root)
	for _, host := range []string{"example.com", "xn--bcher-kva.example", "127.0.0.1", "2001:db8::1"} {
		t.Run(host, func(t *testing.T) {
			l, err := c.Leaf(host)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
				t.Errorf("verify for %s: %v", host, err)
			}
			if _, err := l.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.example"}); err == nil {
				t.Errorf("leaf for %s verifies for other.example", host)
			}
			if l.Leaf.NotAfter.After(root.NotAfter) || l.Leaf.NotAfter.Sub(l.Leaf.NotBefore) > 25*time.Hour {
				t.Errorf("leaf validity %v..%v", l.Leaf.NotBefore, l.Leaf.NotAfter)
			}
		})
	}
}

func TestLeafCacheBounded(t *testing.T) {
	c := newCA(t, Config{CacheSize: 2})
	a1, _ := c.Leaf("a.example")
	a2, _ := c.Leaf("a.example")
	if a1 != a2 {
		t.Error("second Leaf for the same host minted again")
	}
	c.Leaf("b.example")
	c.Leaf("c.example")
	if n := c.CachedLeaves(); n != 2 {
		t.Errorf("cache holds %d leaves, want 2", n)
	}
	a3, _ := c.Leaf("a.example") // evicted as least recently used
	if a3 == a1 {
		t.Error("evicted leaf came back from the cache")
	}
	if c.Minted() != 4 {
		t.Errorf("minted %d, want 4", c.Minted())
	}
}

func TestExpiryRenews(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	c := newCA(t, Config{Validity: 72 * time.Hour, Now: clock})
	old, _ := c.Certificate()
	l1, _ := c.Leaf("a.example")
	now = now.Add(30 * time.Hour) // leaf expired, CA still good
	l2, _ := c.Leaf("a.example")
	if l2 == l1 {
		t.Error("expired leaf served from the cache")
	}
	now = now.Add(40 * time.Hour) // CA within 2 leaf lifetimes of expiry
	cur, _ := c.Certificate()
	if cur.Equal(old) {
		t.Error("CA about to expire was not replaced")
	}
}

func TestWorldReadableKeyRefused(t *testing.T) {
	c := newCA(t, Config{})
	if _, err := c.CertPEM(); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(c.cfg.Dir, KeyFile), 0o644)
	c2 := newCA(t, Config{Dir: c.cfg.Dir})
	if _, err := c2.Leaf("a.example"); err == nil {
		t.Error("a CA key readable by others was used")
	}
}

// TestNonCACertRefused: a ca.crt that is not a CA (an archive's, say)
// is refused with a message naming it, not used to sign leaves.
func TestNonCACertRefused(t *testing.T) {
	c := newCA(t, Config{})
	if _, err := c.CertPEM(); err != nil {
		t.Fatal(err)
	}
	// The same key, in a certificate without CA:TRUE.
	tmpl := *c.cert
	tmpl.IsCA, tmpl.KeyUsage, tmpl.MaxPathLen, tmpl.MaxPathLenZero = false, x509.KeyUsageDigitalSignature, -1, false
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, &c.key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.cfg.Dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := newCA(t, Config{Dir: c.cfg.Dir})
	if _, err := c2.CertPEM(); err == nil || !strings.Contains(err.Error(), "not a CA certificate") {
		t.Errorf("CertPEM with a non-CA ca.crt = %v, want a refusal naming it", err)
	}
}
