package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Signature says how a distribution signs a catalogue entry's checksum
// file: a detached OpenPGP signature next to it, made by a key that a
// keyring package installs on the host. The key never comes from the
// server that serves the image: a server that could swap the image could
// swap a key it served too.
type Signature struct {
	File    string `json:"file"`    // path of the detached signature under Base, no leading slash
	Keyring string `json:"keyring"` // keyring file on the host holding the signer's key (binary OpenPGP, as packages ship them)
	Package string `json:"package"` // what installs Keyring, for the error that it is missing
	Signer  string `json:"signer"`  // who signs, for messages
}

// ErrSignature is wrapped by every refusal of a checksum file's signature:
// missing, bad, by a key not in the keyring, or not checkable at all.
var ErrSignature = errors.New("checksum file signature not verified")

// GPGV is the program signatures are checked with (Debian's gpgv package).
const GPGV = "gpgv"

// VerifyDetached checks with gpgv that sig is a good signature over data by
// a key in keyring, and returns the signing key's fingerprint. gpgv runs
// with an empty home directory of its own, so only keyring counts; data
// and sig are the bytes in memory (the caller then uses those same bytes).
func VerifyDetached(ctx context.Context, keyring string, data, sig []byte) (string, error) {
	if fi, err := os.Stat(keyring); err != nil || !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%w: keyring %s is not a file on this host", ErrSignature, keyring)
	}
	bin, err := exec.LookPath(GPGV)
	if err != nil {
		return "", fmt.Errorf("%w: %s is not installed (Debian package gpgv; scripts/host-deps.sh installs it)", ErrSignature, GPGV)
	}
	dir, err := os.MkdirTemp("", "abox-gpgv-")
	if err != nil {
		return "", fmt.Errorf("checking a signature: %w", err)
	}
	defer os.RemoveAll(dir)
	home := filepath.Join(dir, "home")
	dataFile, sigFile := filepath.Join(dir, "data"), filepath.Join(dir, "data.sig")
	if err := os.Mkdir(home, 0o700); err != nil {
		return "", fmt.Errorf("checking a signature: %w", err)
	}
	if err := os.WriteFile(dataFile, data, 0o600); err != nil {
		return "", fmt.Errorf("checking a signature: %w", err)
	}
	if err := os.WriteFile(sigFile, sig, 0o600); err != nil {
		return "", fmt.Errorf("checking a signature: %w", err)
	}
	abs, err := filepath.Abs(keyring) // gpgv looks a name without a slash up in its home
	if err != nil {
		return "", fmt.Errorf("checking a signature: %w", err)
	}
	cmd := exec.CommandContext(ctx, bin, "--homedir", home, "--keyring", abs, "--status-fd", "1", sigFile, dataFile)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	fpr, problem := judgeStatus(stdout.Bytes())
	if runErr != nil && problem == "" {
		problem = "gpgv failed: " + runErr.Error()
	}
	if problem != "" {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			problem += " (gpgv: " + strings.Join(strings.Fields(msg), " ") + ")"
		}
		return "", fmt.Errorf("%w: %s", ErrSignature, problem)
	}
	return fpr, nil
}

// judgeStatus reads gpgv's status lines: a signature counts only with a
// VALIDSIG and nothing bad beside it (every signature in the file must
// verify). It returns the primary key's fingerprint, or what is wrong.
func judgeStatus(status []byte) (fpr, problem string) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "[GNUPG:]" {
			continue
		}
		switch f[1] {
		case "VALIDSIG":
			if len(f) >= 3 {
				fpr = f[2]
			}
			if len(f) >= 12 {
				fpr = f[11] // the primary key's, when a subkey signed
			}
		case "BADSIG":
			return "", "the signature does not match the checksum file (tampered or corrupted)"
		case "NO_PUBKEY":
			return "", "signed by a key that is not in the keyring"
		case "EXPKEYSIG", "EXPSIG":
			return "", "signed by an expired key, or the signature expired"
		case "REVKEYSIG":
			return "", "signed by a revoked key"
		case "ERRSIG":
			if len(f) >= 8 && f[7] == "9" {
				return "", "signed by a key that is not in the keyring"
			}
			return "", "the signature cannot be checked"
		case "NODATA":
			return "", "the signature file holds no OpenPGP signature"
		}
	}
	if fpr == "" {
		return "", "gpgv reported no valid signature"
	}
	return fpr, ""
}
