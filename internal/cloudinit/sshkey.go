package cloudinit

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"
)

// GenerateSSHKey creates the instance's ed25519 key pair: the private key
// in OpenSSH format at privatePath (mode 0600) and the public key at
// privatePath+".pub". It returns the authorized_keys line for the seed.
// It never replaces an existing key, since that would lock the user out of
// a running guest. rnd is crypto/rand.Reader when nil.
func GenerateSSHKey(privatePath, comment string, rnd io.Reader) (authorizedKey string, err error) {
	if rnd == nil {
		rnd = rand.Reader
	}
	if strings.ContainsAny(comment, "\r\n") {
		return "", fmt.Errorf("generating ssh key: comment must be one line")
	}
	pub, priv, err := ed25519.GenerateKey(rnd)
	if err != nil {
		return "", fmt.Errorf("generating ssh key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return "", fmt.Errorf("generating ssh key: %w", err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("generating ssh key: %w", err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub)))
	if comment != "" {
		line += " " + comment
	}
	if err := writeNew(privatePath, pem.EncodeToMemory(block), 0o600); err != nil {
		return "", fmt.Errorf("generating ssh key: %w", err)
	}
	if err := writeNew(privatePath+".pub", []byte(line+"\n"), 0o644); err != nil {
		// Do not leave a private key without its public half behind.
		os.Remove(privatePath)
		return "", fmt.Errorf("generating ssh key: %w", err)
	}
	return line, nil
}

// writeNew writes data to a temporary file created with perm (so the key
// is never readable by others, not even briefly), syncs it, and links it
// to path, which fails if path exists: no existing file is replaced and no
// reader sees a partial file.
func writeNew(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fmt.Errorf("writing %s: it already exists; remove it first if a new key is really wanted", path)
		}
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
