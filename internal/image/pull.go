package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Pull downloads url, checks that its sha256 is want (hex, required) and
// imports it as name. progress sees stage "download" with bytes done and
// total. A checksum mismatch, an HTTP error or a cancelled context leaves
// nothing behind.
func (s *Store) Pull(ctx context.Context, name, url, want string, progress Progress) (Image, error) {
	if err := ValidateName(name); err != nil {
		return Image{}, err
	}
	want = strings.ToLower(strings.TrimSpace(want))
	if !sha256RE.MatchString(want) {
		return Image{}, fmt.Errorf("pulling image %s: checksum %q is not a hex sha256", name, want)
	}
	if _, err := os.Stat(s.Dir(name)); err == nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, ErrExists)
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
	got, err := s.download(ctx, url, file, progress)
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	if got != want {
		return Image{}, fmt.Errorf("pulling image %s: checksum mismatch for %s: got sha256 %s, want %s", name, url, got, want)
	}
	progress.report("import", 0, 0)
	img, err := s.Import(ctx, name, file, WithSource(url, got))
	if err != nil {
		return Image{}, fmt.Errorf("pulling image %s: %w", name, err)
	}
	return img, nil
}

// download writes url's body to file and returns its hex sha256.
func (s *Store) download(ctx context.Context, url, file string, progress Progress) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("downloading %s: server said %s", url, resp.Status)
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	defer f.Close()
	h := sha256.New()
	pw := &progressWriter{total: resp.ContentLength, report: progress, every: 250 * time.Millisecond}
	if _, err := io.Copy(io.MultiWriter(f, h, pw), resp.Body); err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	if resp.ContentLength >= 0 && pw.done != resp.ContentLength {
		return "", fmt.Errorf("downloading %s: got %d of %d bytes", url, pw.done, resp.ContentLength)
	}
	pw.flush()
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("downloading %s: %w", url, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
