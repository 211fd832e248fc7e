package tetragon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Release is an upstream Tetragon release abox may download.
type Release struct {
	Version string
	URL     string
	// SHA256 is the digest of the linux amd64 tarball, pinned here (never
	// fetched beside the download).
	SHA256 string
}

// Pinned is the release `--monitor-bundle release` downloads: the agent
// whose event types (github.com/cilium/tetragon/api v1.7.1) the host side
// parses. The digest is the one the release publishes for
// tetragon-v1.7.1-amd64.tar.gz (its .sha256sum asset and GitHub's asset
// digest); these machines cannot reach GitHub, so it was taken from three
// independent public projects that pin it, not by downloading it here.
var Pinned = Release{
	Version: "v1.7.1",
	URL:     "https://github.com/cilium/tetragon/releases/download/v1.7.1/tetragon-v1.7.1-amd64.tar.gz",
	SHA256:  "2f36a7bbb2b3d77a011383a01c8f804fe7761d934a76ff2fdf99ebad6f3e89ae",
}

// ChecksumError is a file whose digest is not the one expected.
type ChecksumError struct {
	What, Want, Got string
}

func (e *ChecksumError) Error() string {
	return fmt.Sprintf("%s: sha256 %s, want %s: the file is not the pinned release (refused; nothing was kept)", e.What, e.Got, e.Want)
}

// Cache keeps bundles on the host, by digest.
type Cache struct {
	Dir string
}

// Path is where a bundle of that digest is kept.
func (c Cache) Path(sha string) string {
	return filepath.Join(c.Dir, "sha256-"+sha+".tar.gz")
}

// Import copies the bundle at file into the cache, validates the copy (so
// what is checked is what the guest gets, whatever happens to file later)
// and returns the cached path and what validation found. name is the
// bundle in errors ("" is file).
func (c Cache) Import(file, name string) (string, Info, error) {
	if name == "" {
		name = file
	}
	src, err := openBundle(file, name)
	if err != nil {
		return "", Info{}, err
	}
	defer src.Close()
	return c.store(src, name, "")
}

// store writes r to a temporary file in the cache, validates it under the
// name what, checks its digest against want (when set) and renames it to
// its digest's name.
func (c Cache) store(r io.Reader, what, want string) (string, Info, error) {
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return "", Info{}, err
	}
	tmp, err := os.CreateTemp(c.Dir, ".incoming-*")
	if err != nil {
		return "", Info{}, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, MaxCompressed+1))
	if err != nil {
		return "", Info{}, fmt.Errorf("%s: %w", what, err)
	}
	if n > MaxCompressed {
		return "", Info{}, &BundleError{what, fmt.Sprintf("more than %d bytes", MaxCompressed)}
	}
	got := hex.EncodeToString(h.Sum(nil))
	if want != "" && got != want {
		return "", Info{}, &ChecksumError{what, want, got}
	}
	if err := tmp.Sync(); err != nil {
		return "", Info{}, err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return "", Info{}, err
	}
	info, err := Validate(tmp, what)
	if err != nil {
		return "", Info{}, err
	}
	if info.SHA256 != got {
		return "", Info{}, fmt.Errorf("%s changed while it was read", what)
	}
	dst := c.Path(got)
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return "", Info{}, err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", Info{}, err
	}
	return dst, info, nil
}

// Cached returns the cached bundle of that digest, re-validated, if the
// cache holds it.
func (c Cache) Cached(sha string) (string, Info, bool) {
	p := c.Path(sha)
	info, err := ValidateFile(p)
	if err != nil || info.SHA256 != sha {
		return "", Info{}, false
	}
	return p, info, true
}

// Fetch returns rel from the cache, downloading it over HTTPS first when
// the cache does not hold it. The download is refused unless its sha256 is
// rel.SHA256.
func (c Cache) Fetch(ctx context.Context, client *http.Client, rel Release) (string, Info, error) {
	if rel.SHA256 == "" {
		return "", Info{}, fmt.Errorf("tetragon %s has no pinned sha256, so abox will not download it; give a bundle with --monitor-bundle FILE", rel.Version)
	}
	if p, info, ok := c.Cached(rel.SHA256); ok {
		return p, info, nil
	}
	u, err := url.Parse(rel.URL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return "", Info{}, fmt.Errorf("tetragon %s: download URL %q is not https; abox downloads agents over https only (or give a bundle with --monitor-bundle FILE)", rel.Version, rel.URL)
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute}
	}
	// Redirects (GitHub sends release assets to its CDN) must stay https.
	cl := *client
	cl.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if req.URL.Scheme != "https" {
			return fmt.Errorf("redirected to %s, which is not https", req.URL.Redacted())
		}
		if len(via) >= 10 {
			return errors.New("too many redirects")
		}
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", Info{}, err
	}
	resp, err := cl.Do(req)
	if err != nil {
		return "", Info{}, fmt.Errorf("downloading tetragon %s from %s: %w (on a host without internet give a bundle with --monitor-bundle FILE)", rel.Version, rel.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", Info{}, fmt.Errorf("downloading tetragon %s from %s: %s (give a bundle with --monitor-bundle FILE)", rel.Version, rel.URL, resp.Status)
	}
	what := "tetragon " + rel.Version + " from " + rel.URL
	p, info, err := c.store(resp.Body, what, strings.ToLower(rel.SHA256))
	if err != nil {
		return "", Info{}, err
	}
	return p, info, nil
}
