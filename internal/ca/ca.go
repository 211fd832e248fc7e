// Package ca keeps an instance's interception certificate authority and mints
// short-lived leaf certificates for the hosts the proxy intercepts.
package ca

import (
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
)

// File names inside the CA directory.
const (
	CertFile = "ca.crt"
	KeyFile  = "ca.key"
)

// Config configures a CA.
type Config struct {
	// Dir holds ca.crt (0644) and ca.key (0600); created 0700 if missing.
	Dir string
	// Validity of a new CA certificate; 0 means 90 days. A CA is replaced
	// when less than twice LeafValidity remains.
	Validity time.Duration
	// LeafValidity of minted certificates; 0 means 24h. Leaves never
	// outlive the CA.
	LeafValidity time.Duration
	// CacheSize bounds the leaf cache (entries); 0 means 1024.
	CacheSize int
	// Name is put in the CA subject, e.g. the instance name.
	Name string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// CA is safe for concurrent use. The key pair is loaded or created on first
// use, so a proxy that never intercepts never writes a key.
type CA struct {
	cfg Config

	mu   sync.Mutex // guards everything below
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	der  []byte
	// leafKey signs every leaf: minting stays cheap, and a leaf key is worth
	// no more than the CA key that sits next to it.
	leafKey *ecdsa.PrivateKey
	lru     *list.List // of *entry, most recent first
	byHost  map[string]*list.Element
	minted  uint64
}

type entry struct {
	host string
	cert *tls.Certificate
}

// New returns a CA backed by cfg.Dir; nothing is read or written yet.
func New(cfg Config) (*CA, error) {
	if cfg.Dir == "" {
		return nil, errors.New("creating ca: no directory")
	}
	if cfg.Validity <= 0 {
		cfg.Validity = 90 * 24 * time.Hour
	}
	if cfg.LeafValidity <= 0 {
		cfg.LeafValidity = 24 * time.Hour
	}
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = 1024
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Name == "" {
		cfg.Name = "abox"
	}
	return &CA{cfg: cfg, lru: list.New(), byHost: map[string]*list.Element{}}, nil
}

// CertPEM returns the CA certificate in PEM, creating the CA if needed; the
// guest installs it as a trust anchor.
func (c *CA) CertPEM() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ensureLocked(); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}), nil
}

// Certificate returns the parsed CA certificate, creating the CA if needed.
func (c *CA) Certificate() (*x509.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ensureLocked(); err != nil {
		return nil, err
	}
	return c.cert, nil
}

// CachedLeaves is the number of leaves in the cache.
func (c *CA) CachedLeaves() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

// Minted counts leaves minted since start.
func (c *CA) Minted() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.minted
}

// Leaf returns a certificate for host (a normalised name or an IP address),
// from the cache when it is still valid for at least a quarter of its life.
func (c *CA) Leaf(host string) (*tls.Certificate, error) {
	if host == "" {
		return nil, errors.New("minting certificate: empty host")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ensureLocked(); err != nil {
		return nil, err
	}
	now := c.cfg.Now()
	if el, ok := c.byHost[host]; ok {
		e := el.Value.(*entry)
		if e.cert.Leaf.NotAfter.Sub(now) > c.cfg.LeafValidity/4 && e.cert.Leaf.NotAfter.Before(c.cert.NotAfter.Add(time.Second)) {
			c.lru.MoveToFront(el)
			return e.cert, nil
		}
		c.lru.Remove(el)
		delete(c.byHost, host)
	}
	// Minting under the lock is a few tens of microseconds; it keeps two
	// handshakes for one host from minting twice.
	cert, err := c.mintLocked(host, now)
	if err != nil {
		return nil, err
	}
	c.byHost[host] = c.lru.PushFront(&entry{host: host, cert: cert})
	for c.lru.Len() > c.cfg.CacheSize {
		old := c.lru.Back()
		c.lru.Remove(old)
		delete(c.byHost, old.Value.(*entry).host)
	}
	return cert, nil
}

func (c *CA) mintLocked(host string, now time.Time) (*tls.Certificate, error) {
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(c.cfg.LeafValidity)
	if notAfter.After(c.cert.NotAfter) {
		notAfter = c.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if a, err := netip.ParseAddr(host); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &c.leafKey.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("minting certificate for %s: %w", host, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("minting certificate for %s: %w", host, err)
	}
	c.minted++
	return &tls.Certificate{Certificate: [][]byte{der, c.der}, PrivateKey: c.leafKey, Leaf: leaf}, nil
}

// ensureLocked loads the CA from disk, or creates it when it is missing or
// about to expire.
func (c *CA) ensureLocked() error {
	now := c.cfg.Now()
	if c.cert != nil && c.cert.NotAfter.Sub(now) > 2*c.cfg.LeafValidity {
		return nil
	}
	if c.leafKey == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("creating leaf key: %w", err)
		}
		c.leafKey = k
	}
	cert, key, der, err := c.load()
	switch {
	case err == nil && cert.NotAfter.Sub(now) > 2*c.cfg.LeafValidity:
	case err == nil || errors.Is(err, fs.ErrNotExist):
		// Missing or about to expire: a fresh CA; the guest must re-trust it.
		cert, key, der, err = c.create(now)
		if err != nil {
			return err
		}
	default:
		return err
	}
	c.cert, c.key, c.der = cert, key, der
	c.lru.Init()
	clear(c.byHost)
	return nil
}

func (c *CA) load() (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	certPEM, err := os.ReadFile(filepath.Join(c.cfg.Dir, CertFile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading ca: %w", err)
	}
	st, err := os.Stat(filepath.Join(c.cfg.Dir, KeyFile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading ca: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, nil, nil, fmt.Errorf("loading ca: %s is readable by others (mode %v); chmod 600 it", filepath.Join(c.cfg.Dir, KeyFile), st.Mode().Perm())
	}
	keyPEM, err := os.ReadFile(filepath.Join(c.cfg.Dir, KeyFile))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading ca: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, nil, errors.New("loading ca: no PEM block in ca.crt or ca.key")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading ca: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("loading ca: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, nil, nil, errors.New("loading ca: ca.key does not match ca.crt")
	}
	// ca.crt may come from an imported archive: a leaf there would sign
	// leaves no guest accepts, so every TLS connection would fail later
	// with a message about the guest, not about this file.
	if !cert.BasicConstraintsValid || !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, nil, errors.New("loading ca: ca.crt is not a CA certificate (it needs basic constraints CA:TRUE and the certSign key usage)")
	}
	return cert, key, cb.Bytes, nil
}

func (c *CA) create(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	if err := os.MkdirAll(c.cfg.Dir, 0o700); err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "abox interception CA " + c.cfg.Name, Organization: []string{"abox"}},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(c.cfg.Validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	// Key first: a crash between the two writes leaves a key without a
	// certificate, which the next start replaces, never the reverse.
	if err := fsutil.WriteFileAtomic(filepath.Join(c.cfg.Dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(c.cfg.Dir, CertFile), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return nil, nil, nil, fmt.Errorf("creating ca: %w", err)
	}
	return cert, key, der, nil
}

func randSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("creating serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}
