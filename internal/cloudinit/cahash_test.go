package cloudinit

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestSubjectHashMatchesOpenSSL compares subjectHash with what the real
// openssl prints for the same certificate: the guest's OpenSSL looks the CA
// up by that file name, so a wrong hash means Python and openssl clients in
// the guest do not trust the instance CA.
func TestSubjectHashMatchesOpenSSL(t *testing.T) {
	openssl := need.Program(t, "openssl")
	subjects := map[string]pkix.Name{
		"abox":          {CommonName: "abox interception CA dev", Organization: []string{"abox"}},
		"spaces-case":   {CommonName: "  Mixed   CASE\tName  ", Organization: []string{"Some Org"}, Country: []string{"DE"}},
		"unicode":       {CommonName: "Zertifizierungsstelle Über", Locality: []string{"Köln"}},
		"many":          {CommonName: "x", Organization: []string{"a", "b"}, OrganizationalUnit: []string{"u"}, Province: []string{"P"}, SerialNumber: "42"},
		"printable-ish": {CommonName: "A-B.C (d)"},
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, subj := range subjects {
		t.Run(name, func(t *testing.T) {
			tmpl := &x509.Certificate{
				SerialNumber: big.NewInt(1), Subject: subj,
				NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
				IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
			}
			der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, name+".pem")
			if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(openssl, "x509", "-hash", "-noout", "-in", file).CombinedOutput()
			if err != nil {
				t.Fatalf("openssl: %v\n%s", err, out)
			}
			got, err := subjectHash(cert)
			if err != nil {
				t.Fatal(err)
			}
			if want := strings.TrimSpace(string(out)); got != want {
				t.Errorf("subjectHash = %s, openssl says %s", got, want)
			}
		})
	}
}
