// Package identity is the protocol that renews the identity of a guest
// restored from a shared memory image (docs/warm-start.md): one request
// from the host, one reply from the guest's agent, over the guest's
// virtio-serial channel, before its network link comes up.
package identity

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/abox-dev/abox/internal/validate"
)

// Version is the protocol's version; a reply of another is refused.
const Version = 1

// Channel is the virtio-serial port the guest's agent reads requests from
// (/dev/virtio-ports/Channel in the guest).
const Channel = "org.abox.identity.0"

// EntropyBytes is how much of the host's randomness reseeds the guest's pool.
const EntropyBytes = 64

// Identity is what makes one instance itself, as abox decided at create.
type Identity struct {
	// Hostname is the guest's hostname label: cloudinit.Hostname of the
	// instance's name, as a cold boot's seed sets it.
	Hostname string
	User     string // the login user whose authorised key is replaced
	// AuthorizedKey is the user's public key line ("ssh-ed25519 AAAA...").
	AuthorizedKey string
	// HostKeyPEM is the guest's SSH host private key (OpenSSH PEM); its
	// public half is what known_hosts pins.
	HostKeyPEM []byte
	CACertPEM  []byte // the instance CA's certificate
	Network    Network
}

// Network is the guest's side of its instance network.
type Network struct {
	MAC     string       `json:"mac"`     // the NIC's, as the domain names it
	Address netip.Prefix `json:"address"` // the guest's address in its /24
	Gateway netip.Addr   `json:"gateway"` // where the filters listen
}

// Request is what the host sends. Every field is required.
type Request struct {
	Version int `json:"v"`
	// Nonce ties the reply to this request (32 hex digits, random).
	Nonce         string `json:"nonce"`
	Hostname      string `json:"hostname"`
	User          string `json:"user"`
	AuthorizedKey string `json:"authorized_key"`
	HostKeyPEM    string `json:"host_key"`
	CACertPEM     string `json:"ca_cert"`
	// MachineID is the new /etc/machine-id: 32 lowercase hex digits.
	MachineID string `json:"machine_id"`
	// Entropy reseeds the guest's random pool (EntropyBytes, credited).
	Entropy []byte `json:"entropy"`
	// Time is the host's clock when the request was made; the guest sets
	// its clock to it.
	Time    time.Time `json:"time"`
	Network Network   `json:"network"`
}

// Reply is what the guest's agent reports having now. It is the guest's
// word: Check holds it to the request, nothing of it is trusted.
type Reply struct {
	Version int    `json:"v"`
	Nonce   string `json:"nonce"`
	// Error, when set, is the step that failed in the guest; the other
	// fields are then not read.
	Error *GuestError `json:"error,omitempty"`
	// HostKeySHA256 is the installed host key's fingerprint in OpenSSH's
	// form ("SHA256:base64").
	HostKeySHA256 string    `json:"host_key_sha256,omitempty"`
	MachineID     string    `json:"machine_id,omitempty"`
	Hostname      string    `json:"hostname,omitempty"`
	Time          time.Time `json:"time,omitzero"`
	// CASHA256 are the sha256 (hex, of the DER) of every abox CA in the
	// guest's trust store after the renewal: the new one alone.
	CASHA256 []string `json:"ca_sha256,omitempty"`
	Network  Network  `json:"network"`
}

// GuestError is the agent's report of the step that failed.
type GuestError struct {
	Step   string `json:"step"`
	Reason string `json:"reason"`
}

// NewRequest makes the request that gives a guest id, with a fresh nonce,
// machine-id and entropy from random (crypto/rand in production).
func NewRequest(random io.Reader, id Identity, now time.Time) (Request, error) {
	var b [16 + 16 + EntropyBytes]byte
	if _, err := io.ReadFull(random, b[:]); err != nil {
		return Request{}, fmt.Errorf("renewing the identity: reading randomness: %w", err)
	}
	req := Request{
		Version: Version, Nonce: hex.EncodeToString(b[:16]),
		Hostname: id.Hostname, User: id.User, AuthorizedKey: id.AuthorizedKey,
		HostKeyPEM: string(id.HostKeyPEM), CACertPEM: string(id.CACertPEM),
		MachineID: hex.EncodeToString(b[16:32]), Entropy: append([]byte(nil), b[32:]...),
		Time: now.UTC(), Network: id.Network,
	}
	return req, req.Validate()
}

// Validate refuses a request with a missing or malformed item (the agent
// runs it too, before it changes anything).
func (r Request) Validate() error {
	bad := func(item, why string) error { return fmt.Errorf("identity request: %s: %s", item, why) }
	switch {
	case r.Version != Version:
		return bad("version", fmt.Sprintf("%d, want %d", r.Version, Version))
	case !isHex(r.Nonce, 32):
		return bad("nonce", "want 32 hex digits")
	case !isHex(r.MachineID, 32) || r.MachineID == strings.Repeat("0", 32):
		return bad("machine-id", "want 32 lowercase hex digits, not all zero")
	case len(r.Entropy) != EntropyBytes:
		return bad("entropy", fmt.Sprintf("%d bytes, want %d", len(r.Entropy), EntropyBytes))
	case r.Time.IsZero():
		return bad("time", "missing")
	case r.User == "" || strings.ContainsAny(r.User, "/\x00\n") || r.User == "root":
		return bad("user", "want the instance's login user")
	}
	if !isLabel(r.Hostname) {
		return bad("hostname", fmt.Sprintf("%q: want a hostname label (cloudinit.Hostname of the instance's name)", r.Hostname))
	}
	if _, _, _, rest, err := ssh.ParseAuthorizedKey([]byte(r.AuthorizedKey)); err != nil || len(rest) != 0 {
		return bad("authorized key", "want one public key line")
	}
	if _, err := HostKeyFingerprint([]byte(r.HostKeyPEM)); err != nil {
		return bad("host key", err.Error())
	}
	if _, err := CAFingerprint([]byte(r.CACertPEM)); err != nil {
		return bad("CA certificate", err.Error())
	}
	if err := validate.GuestMAC(r.Network.MAC); err != nil {
		return bad("MAC", err.Error())
	}
	n := r.Network
	if !n.Address.IsValid() || !n.Address.Addr().Is4() || !n.Gateway.Is4() || !n.Address.Contains(n.Gateway) || n.Address.Addr() == n.Gateway {
		return bad("network", fmt.Sprintf("address %s, gateway %s: want an IPv4 address and another gateway in its subnet", n.Address, n.Gateway))
	}
	return nil
}

// HostKeyFingerprint is the OpenSSH SHA256 fingerprint of a host private
// key's public half, as the agent reports it.
func HostKeyFingerprint(privPEM []byte) (string, error) {
	signer, err := ssh.ParsePrivateKey(privPEM)
	if err != nil {
		return "", fmt.Errorf("not an OpenSSH private key: %w", err)
	}
	return ssh.FingerprintSHA256(signer.PublicKey()), nil
}

// CAFingerprint is the sha256 (hex) of the one certificate in certPEM.
func CAFingerprint(certPEM []byte) (string, error) {
	blk, rest := pem.Decode(certPEM)
	if blk == nil || blk.Type != "CERTIFICATE" || len(strings.TrimSpace(string(rest))) != 0 {
		return "", errors.New("want one PEM certificate")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", err
	}
	if !cert.IsCA {
		return "", errors.New("the certificate is not a CA")
	}
	sum := sha256.Sum256(blk.Bytes)
	return hex.EncodeToString(sum[:]), nil
}

// isLabel: 1-63 lowercase letters, digits and '-', not at either end.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
