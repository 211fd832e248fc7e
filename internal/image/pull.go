package image

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Algorithm is a hash function a download can be verified with.
type Algorithm string

// The algorithms Pull verifies with; cloud image publishers use one of these.
const (
	SHA256 Algorithm = "sha256"
	SHA512 Algorithm = "sha512"
)

var hexRE = map[Algorithm]*regexp.Regexp{
	SHA256: regexp.MustCompile(`^[0-9a-f]{64}$`),
	SHA512: regexp.MustCompile(`^[0-9a-f]{128}$`),
}

func (a Algorithm) new() hash.Hash {
	if a == SHA512 {
		return sha512.New()
	}
	return sha256.New()
}

// Checksum is the digest a download must have.
type Checksum struct {
	Algorithm Algorithm // SHA256 or SHA512
	Hex       string    // lowercase hex of the full digest
}

func (c Checksum) String() string { return string(c.Algorithm) + " " + c.Hex }

// ParseChecksum checks that hexSum is a full digest for algo and returns it
// normalised to lowercase.
func ParseChecksum(algo Algorithm, hexSum string) (Checksum, error) {
	re, ok := hexRE[algo]
	if !ok {
		return Checksum{}, fmt.Errorf("checksum algorithm %q is not supported (want sha256 or sha512)", algo)
	}
	h := strings.ToLower(strings.TrimSpace(hexSum))
	if !re.MatchString(h) {
		return Checksum{}, fmt.Errorf("checksum %q is not a hex %s", hexSum, algo)
	}
	return Checksum{Algorithm: algo, Hex: h}, nil
}

// Pull downloads url, checks that its sha256 is want (hex, required) and
// imports it as name. It is PullChecksum with a SHA-256.
func (s *Store) Pull(ctx context.Context, name, url, want string, progress Progress) (Image, error) {
	sum, err := ParseChecksum(SHA256, want)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	return s.PullChecksum(ctx, name, url, sum, progress)
}

// PullChecksum downloads url, checks its digest against want and imports it
// as name. The metadata records the URL and the sha256 of the download
// whatever algorithm verified it. progress sees stage "download" with bytes
// done and total, then "import". A checksum mismatch, an HTTP error or a
// cancelled context leaves nothing behind.
func (s *Store) PullChecksum(ctx context.Context, name, url string, want Checksum, progress Progress) (Image, error) {
	return s.pullChecksum(ctx, name, url, want, progress, string(want.Algorithm)+" given on the command line; no signature", "")
}

func (s *Store) pullChecksum(ctx context.Context, name, url string, want Checksum, progress Progress, verified, signedBy string) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	want, err := ParseChecksum(want.Algorithm, want.Hex)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	if err := CheckDownloadURL(url); err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	if err := s.checkFree(name); err != nil {
		return Image{}, err
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	tmp, err := os.MkdirTemp(s.dir, ".pull-"+name+"-")
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	defer os.RemoveAll(tmp)

	file := filepath.Join(tmp, "download")
	sums, err := s.download(ctx, url, file, want.Algorithm, progress)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	if got := sums[want.Algorithm]; got != want.Hex {
		return Image{}, fmt.Errorf("pulling image %s: checksum mismatch for %s: expected %s %s, got %s", name, url, want.Algorithm, want.Hex, got)
	}
	progress.report("import", 0, 0)
	img, err := s.Import(ctx, name, file, WithSource(url, sums[SHA256]), withVerified(verified, signedBy))
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	return img, nil
}

// checkFree refuses early, before any network traffic, when name is taken.
// Import checks again atomically.
func (s *Store) checkFree(name string) error {
	if _, err := os.Stat(s.Dir(name)); err == nil {
		return fmt.Errorf("pulling image %s: %w", name, ErrExists)
	}
	return nil
}

// ErrInsecureURL is wrapped when a download URL (or a redirect) is not
// https: a checksum fetched over plain HTTP vouches for nothing, since
// whoever is on the path rewrites it together with the image.
var ErrInsecureURL = errors.New("downloads must use https")

// CheckDownloadURL accepts https URLs, and http only to a loopback host
// (a local mirror on this machine, where no one is on the path).
func CheckDownloadURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("url %q: %w", raw, err)
	}
	if u.Host == "" {
		return fmt.Errorf("url %q: want an absolute https:// URL", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if h := u.Hostname(); h == "localhost" {
			return nil
		} else if ip, err := netip.ParseAddr(h); err == nil && ip.IsLoopback() {
			return nil
		}
	}
	return fmt.Errorf("url %q: %w (plain http is accepted only from a loopback mirror)", raw, ErrInsecureURL)
}

// secureClient is c with redirects held to CheckDownloadURL too.
func secureClient(c *http.Client) *http.Client {
	cc := *c
	next := c.CheckRedirect
	cc.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if err := CheckDownloadURL(req.URL.String()); err != nil {
			return fmt.Errorf("redirected: %w", err)
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return nil
	}
	return &cc
}

// get issues a GET for url and returns the response of a 200 answer.
func (s *Store) get(ctx context.Context, url string) (*http.Response, error) {
	if err := CheckDownloadURL(url); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("server said %s", resp.Status)
	}
	return resp, nil
}

// download writes url's body to file and returns its hex digests: always
// sha256 (recorded in the metadata) and also verify when it differs.
func (s *Store) download(ctx context.Context, url, file string, verify Algorithm, progress Progress) (map[Algorithm]string, error) {
	resp, err := s.get(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	defer resp.Body.Close()
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	defer f.Close()
	hashes := map[Algorithm]hash.Hash{SHA256: SHA256.new()}
	if verify != SHA256 {
		hashes[verify] = verify.new()
	}
	ws := []io.Writer{f}
	for _, h := range hashes {
		ws = append(ws, h)
	}
	pw := &progressWriter{total: resp.ContentLength, report: progress, every: 250 * time.Millisecond}
	ws = append(ws, pw)
	if _, err := io.Copy(io.MultiWriter(ws...), resp.Body); err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	if resp.ContentLength >= 0 && pw.done != resp.ContentLength {
		return nil, fmt.Errorf("downloading %s: got %d of %d bytes", url, pw.done, resp.ContentLength)
	}
	pw.flush()
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("downloading %s: %w", url, err)
	}
	sums := make(map[Algorithm]string, len(hashes))
	for a, h := range hashes {
		sums[a] = hex.EncodeToString(h.Sum(nil))
	}
	return sums, nil
}

// progressWriter counts bytes and reports them at most once per interval.
type progressWriter struct {
	total  int64
	done   int64
	report Progress
	every  time.Duration
	last   time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	p.done += int64(len(b))
	if now := time.Now(); now.Sub(p.last) >= p.every {
		p.last = now
		p.report.report("download", p.done, p.total)
	}
	return len(b), nil
}

func (p *progressWriter) flush() { p.report.report("download", p.done, p.total) }
