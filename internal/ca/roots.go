package ca

import (
	"crypto/x509"
	"fmt"
	"os"
)

// UpstreamRoots is the pool the proxy verifies origins against: the system
// roots plus the PEM certificates in extraFile (none when it is empty).
func UpstreamRoots(extraFile string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if extraFile == "" {
		return pool, nil
	}
	b, err := os.ReadFile(extraFile)
	if err != nil {
		return nil, fmt.Errorf("reading upstream CA bundle: %w", err)
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("reading upstream CA bundle %s: no PEM certificate in it", extraFile)
	}
	return pool, nil
}
