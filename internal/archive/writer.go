package archive

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Writer writes an archive to a temporary file next to its destination and
// renames it into place on Commit: a failed or interrupted export never
// leaves a partial archive under the destination's name.
type Writer struct {
	dest string
	f    *os.File
	bw   *bufio.Writer
	gz   *gzip.Writer
	tw   *tar.Writer
	m    Manifest
	next int
	now  time.Time
}

// Create starts the archive dest with manifest m (checked first) written
// as its first entry. The file is 0600: it holds the instance's private keys.
func Create(dest string, m Manifest) (*Writer, error) {
	m.Format, m.Version = Format, Version
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now().UTC()
	}
	if err := m.Check(); err != nil {
		return nil, fmt.Errorf("writing archive %s: %w", dest, err)
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("writing archive %s: %w", dest, err)
	}
	if len(b) > MaxManifest {
		return nil, fmt.Errorf("writing archive %s: the manifest is %d bytes, over %d", dest, len(b), MaxManifest)
	}
	f, err := os.CreateTemp(filepath.Dir(dest), "."+filepath.Base(dest)+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("writing archive %s: %w", dest, err)
	}
	w := &Writer{dest: dest, f: f, m: m, now: m.CreatedAt}
	w.bw = bufio.NewWriterSize(f, 1<<20)
	// BestSpeed: a flattened qcow2 holds only allocated clusters, and a
	// slower level costs minutes on a disk of gigabytes for little gain.
	w.gz, _ = gzip.NewWriterLevel(w.bw, gzip.BestSpeed)
	w.tw = tar.NewWriter(w.gz)
	if err := w.entry(ManifestName, int64(len(b))); err == nil {
		_, err = w.tw.Write(b)
	}
	if err != nil {
		w.Abort()
		return nil, fmt.Errorf("writing archive %s: %w", dest, err)
	}
	return w, nil
}

func (w *Writer) entry(name string, size int64) error {
	return w.tw.WriteHeader(&tar.Header{
		Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o600,
		ModTime: w.now, Format: tar.FormatPAX,
	})
}

// Add writes the next entry the manifest lists, exactly its size from r.
func (w *Writer) Add(name string, r io.Reader) error {
	if w.next >= len(w.m.Files) || w.m.Files[w.next].Name != name {
		return fmt.Errorf("writing archive %s: entry %s is not the next the manifest lists", w.dest, name)
	}
	f := w.m.Files[w.next]
	w.next++
	if err := w.entry(f.Name, f.Size); err != nil {
		return fmt.Errorf("writing archive %s: %w", w.dest, err)
	}
	n, err := io.Copy(w.tw, io.LimitReader(r, f.Size))
	if err != nil {
		return fmt.Errorf("writing archive %s: %s: %w", w.dest, name, err)
	}
	if n != f.Size {
		return fmt.Errorf("writing archive %s: %s ended at %d of %d bytes (did it change meanwhile?)", w.dest, name, n, f.Size)
	}
	return nil
}

// Commit finishes the archive, syncs it and renames it into place.
func (w *Writer) Commit() error {
	err := func() error {
		if w.next != len(w.m.Files) {
			return fmt.Errorf("%d of %d entries written", w.next, len(w.m.Files))
		}
		for _, c := range []func() error{w.tw.Close, w.gz.Close, w.bw.Flush, w.f.Sync, w.f.Close} {
			if err := c(); err != nil {
				return err
			}
		}
		if err := os.Rename(w.f.Name(), w.dest); err != nil {
			return err
		}
		d, err := os.Open(filepath.Dir(w.dest))
		if err != nil {
			return err
		}
		defer d.Close()
		return d.Sync()
	}()
	if err != nil {
		w.Abort()
		return fmt.Errorf("writing archive %s: %w", w.dest, err)
	}
	return nil
}

// Abort removes the temporary file; safe after Commit and twice.
func (w *Writer) Abort() {
	w.f.Close()
	if err := os.Remove(w.f.Name()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return
	}
}
