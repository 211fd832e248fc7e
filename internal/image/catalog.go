package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
)

// EnvMirror names the environment variable the CLI reads for a mirror of
// the catalogue's upstream servers (see CatalogEntry.URLs).
const EnvMirror = "ABOX_IMAGE_MIRROR"

// MaxSumsSize bounds a checksum file: upstream ones are a few KiB, and a
// server that sends more is not serving a checksum file.
const MaxSumsSize = 1 << 20

// CatalogEntry is a cloud image abox knows how to fetch and verify. The
// image and its checksum file live under Base; a mirror replaces Base and
// keeps the paths, so a mirror copies the upstream directory layout.
type CatalogEntry struct {
	Name        string    `json:"name"`        // catalogue name and the base name it installs as; a valid image name
	Description string    `json:"description"` // one line for listings
	Base        string    `json:"base"`        // upstream URL prefix, no trailing slash
	Image       string    `json:"image"`       // path of the image under Base, no leading slash
	Sums        string    `json:"sums"`        // path of the checksum file under Base, no leading slash
	File        string    `json:"file"`        // name of the image inside the checksum file
	Algorithm   Algorithm `json:"algorithm"`   // hash the checksum file lists
	// Signature is how the distribution signs the checksum file; nil when
	// it does not, and then Unsigned says so for listings.
	Signature *Signature `json:"signature,omitempty"`
	Unsigned  string     `json:"unsigned,omitempty"`
}

// What the distributions publish (docs/images.md, "Signed checksum files"):
// Ubuntu signs each cloud image directory's SHA256SUMS (detached,
// SHA256SUMS.gpg) with its cloud image key, which Ubuntu's keyring
// packages install and Debian's archive does not carry; Debian publishes
// no signature for its cloud images' SHA512SUMS (SHA512SUMS.sign, as its
// installer images have, is absent there).
const (
	debianUnsigned = "Debian publishes no signature for its cloud images' checksum files"
	ubuntuKeyring  = "/usr/share/keyrings/ubuntu-cloudimage-keyring.gpg"
	ubuntuPackage  = "Ubuntu's ubuntu-keyring (ubuntu-cloudimage-keyring on older releases); Debian's archive has neither"
	ubuntuSigner   = "Ubuntu's cloud image key (UEC Image Automatic Signing Key)"
)

// Catalog returns the built-in catalogue, sorted by name. Each call returns
// a fresh slice.
func Catalog() []CatalogEntry {
	const debian = "https://cloud.debian.org/images/cloud"
	const ubuntu = "https://cloud-images.ubuntu.com"
	ubuntuSig := func(dir string) *Signature {
		return &Signature{File: dir + "/SHA256SUMS.gpg", Keyring: ubuntuKeyring, Package: ubuntuPackage, Signer: ubuntuSigner}
	}
	return []CatalogEntry{
		{
			Name: "debian-12", Description: "Debian 12 (bookworm) generic cloud image, amd64",
			Base: debian, Image: "bookworm/latest/debian-12-genericcloud-amd64.qcow2",
			Sums: "bookworm/latest/SHA512SUMS", File: "debian-12-genericcloud-amd64.qcow2", Algorithm: SHA512,
			Unsigned: debianUnsigned,
		},
		{
			Name: "debian-13", Description: "Debian 13 (trixie) generic cloud image, amd64",
			Base: debian, Image: "trixie/latest/debian-13-genericcloud-amd64.qcow2",
			Sums: "trixie/latest/SHA512SUMS", File: "debian-13-genericcloud-amd64.qcow2", Algorithm: SHA512,
			Unsigned: debianUnsigned,
		},
		{
			Name: "ubuntu-22.04", Description: "Ubuntu 22.04 LTS (jammy) server cloud image, amd64",
			Base: ubuntu, Image: "jammy/current/jammy-server-cloudimg-amd64.img",
			Sums: "jammy/current/SHA256SUMS", File: "jammy-server-cloudimg-amd64.img", Algorithm: SHA256,
			Signature: ubuntuSig("jammy/current"),
		},
		{
			Name: "ubuntu-24.04", Description: "Ubuntu 24.04 LTS (noble) server cloud image, amd64",
			Base: ubuntu, Image: "noble/current/noble-server-cloudimg-amd64.img",
			Sums: "noble/current/SHA256SUMS", File: "noble-server-cloudimg-amd64.img", Algorithm: SHA256,
			Signature: ubuntuSig("noble/current"),
		},
	}
}

// CatalogNames returns the names in the built-in catalogue.
func CatalogNames() []string {
	var names []string
	for _, e := range Catalog() {
		names = append(names, e.Name)
	}
	return names
}

// ErrUnknownCatalog means a name is not in the built-in catalogue.
var ErrUnknownCatalog = errors.New("not in the image catalogue")

// LookupCatalog returns the named catalogue entry; the error of an unknown
// name lists the known ones.
func LookupCatalog(name string) (CatalogEntry, error) {
	for _, e := range Catalog() {
		if e.Name == name {
			return e, nil
		}
	}
	return CatalogEntry{}, fmt.Errorf("image %q: %w (known: %s)", name, ErrUnknownCatalog, strings.Join(CatalogNames(), ", "))
}

// URLs returns where the image and its checksum file are fetched from:
// under Base, or under mirror when it is not empty. mirror must be an
// absolute https URL (http only on a loopback host) without query or
// fragment.
func (e CatalogEntry) URLs(mirror string) (image, sums string, err error) {
	base := e.Base
	if mirror != "" {
		u, err := url.Parse(mirror)
		if err != nil {
			return "", "", fmt.Errorf("mirror %q: %w", mirror, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return "", "", fmt.Errorf("mirror %q: want an https:// URL without query or fragment", mirror)
		}
		if err := CheckDownloadURL(mirror); err != nil {
			return "", "", fmt.Errorf("mirror: %w", err)
		}
		base = strings.TrimRight(mirror, "/")
	}
	return base + "/" + e.Image, base + "/" + e.Sums, nil
}

// SignatureURL is where the entry's checksum file signature is fetched
// from (under mirror when it is not empty); "" for an unsigned entry.
func (e CatalogEntry) SignatureURL(mirror string) (string, error) {
	if e.Signature == nil {
		return "", nil
	}
	image, _, err := e.URLs(mirror)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(image, e.Image) + e.Signature.File, nil
}

// CatalogPull says where a catalogue pull fetches from and what it trusts.
type CatalogPull struct {
	Mirror string // replaces the entry's Base when not empty
	// Keyring replaces the entry's Signature.Keyring when not empty; an
	// error for an entry that is not signed.
	Keyring string
	// Unsigned accepts a signed entry's checksum file without checking its
	// signature (the base is recorded as not signature-checked).
	Unsigned bool
}

// PullCatalog fetches the entry's checksum file (from mirror when it is not
// empty), finds the image's digest in it, then downloads, verifies and
// imports the image as name like PullChecksum. progress sees stage
// "checksums" first. Nothing is written before the image is verified.
func (s *Store) PullCatalog(ctx context.Context, name string, entry CatalogEntry, opts CatalogPull, progress Progress) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	imageURL, sumsURL, err := entry.URLs(opts.Mirror)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	sig := entry.Signature
	if opts.Keyring != "" && (sig == nil || opts.Unsigned) {
		if sig == nil {
			return Image{}, fmt.Errorf("pulling image %s: a keyring was given, but %s's checksum file has no signature to check it with (%s)", name, entry.Name, entry.Unsigned)
		}
		return Image{}, fmt.Errorf("pulling image %s: a keyring and unsigned are contradictory: give one", name)
	}
	keyring := ""
	if sig != nil && !opts.Unsigned {
		keyring = sig.Keyring
		if opts.Keyring != "" {
			keyring = opts.Keyring
		}
		if fi, err := os.Stat(keyring); err != nil || !fi.Mode().IsRegular() {
			return Image{}, fmt.Errorf("pulling image %s: %w: %s signs %s, but the keyring %s is not on this host: install it (%s), give a keyring file holding that key (--keyring), or accept the checksum file on its https transfer alone (--unsigned)",
				name, ErrSignature, sig.Signer, entry.Sums, keyring, sig.Package)
		}
	}
	if err := s.checkFree(name); err != nil {
		return Image{}, err
	}
	progress.report("checksums", 0, 0)
	data, err := s.fetchSums(ctx, sumsURL)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	verified := string(entry.Algorithm) + " from " + sumsURL
	signedBy := ""
	switch {
	case keyring != "":
		sigURL, err := entry.SignatureURL(opts.Mirror)
		if err != nil {
			return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
		}
		sigData, err := s.fetchSmall(ctx, "signature", sigURL)
		if err != nil {
			return Image{}, fmt.Errorf("pulling image %s: %w: %s signs %s and its signature could not be fetched (%v); the image was not downloaded. A mirror must copy %s too",
				name, ErrSignature, sig.Signer, entry.Sums, err, sig.File)
		}
		if signedBy, err = VerifyDetached(ctx, keyring, data, sigData); err != nil {
			return Image{}, fmt.Errorf("pulling image %s: checksums %s, signature %s, keyring %s: %w; the image was not downloaded (check the mirror, or the keyring with gpg --show-keys)",
				name, sumsURL, sigURL, keyring, err)
		}
		verified += ", signature by " + signedBy + " checked with " + keyring
	case sig != nil:
		verified += " (checksum not signature-checked: pulled with --unsigned)"
	default:
		verified += " (checksum not signature-checked: " + entry.Unsigned + ")"
	}
	want, err := FindSum(data, entry.File, entry.Algorithm)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: checksums %s: %w", name, sumsURL, err)
	}
	return s.pullChecksum(ctx, name, imageURL, want, progress, verified, signedBy)
}

// fetchSums reads a checksum file of at most MaxSumsSize bytes.
func (s *Store) fetchSums(ctx context.Context, url string) ([]byte, error) {
	return s.fetchSmall(ctx, "checksums", url)
}

// fetchSmall reads a checksum file or its signature (what), of at most
// MaxSumsSize bytes.
func (s *Store) fetchSmall(ctx context.Context, what, url string) ([]byte, error) {
	resp, err := s.get(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("fetching %s %s: %w", what, url, err)
	}
	defer resp.Body.Close()
	if resp.ContentLength > MaxSumsSize {
		return nil, fmt.Errorf("fetching %s %s: %d bytes is more than the limit of %d", what, url, resp.ContentLength, MaxSumsSize)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxSumsSize+1))
	if err != nil {
		return nil, fmt.Errorf("fetching %s %s: %w", what, url, err)
	}
	if len(data) > MaxSumsSize {
		return nil, fmt.Errorf("fetching %s %s: more than the limit of %d bytes", what, url, MaxSumsSize)
	}
	return data, nil
}

// FindSum returns the digest data lists for file. data is in the format of
// sha256sum and sha512sum: "HEX  NAME" (text mode) or "HEX *NAME" (binary
// mode) per line; a NAME of "./file" matches file. Blank lines and lines
// starting with # are skipped. A line that does not parse, a digest of the
// wrong length, no line for file, or two lines for it that disagree are
// errors: the file is the only thing vouching for the image.
func FindSum(data []byte, file string, algo Algorithm) (Checksum, error) {
	var found []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxSumsSize)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sum, name, ok := strings.Cut(line, " ")
		if !ok || sum == "" || len(name) < 2 || (name[0] != ' ' && name[0] != '*') {
			return Checksum{}, fmt.Errorf("line %d: want \"HEX  NAME\" or \"HEX *NAME\"", n)
		}
		name = strings.TrimPrefix(name[1:], "./")
		if name != file {
			continue
		}
		c, err := ParseChecksum(algo, sum)
		if err != nil {
			return Checksum{}, fmt.Errorf("line %d: %w", n, err)
		}
		found = append(found, c.Hex)
	}
	if err := sc.Err(); err != nil {
		return Checksum{}, err
	}
	if len(found) == 0 {
		return Checksum{}, fmt.Errorf("no %s for %s", algo, file)
	}
	for _, h := range found[1:] {
		if h != found[0] {
			return Checksum{}, fmt.Errorf("%d different %s sums for %s", len(found), algo, file)
		}
	}
	return Checksum{Algorithm: algo, Hex: found[0]}, nil
}
