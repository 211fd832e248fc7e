package archive

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Reader reads an archive entry by entry, refusing everything but what the
// manifest names: regular files with the manifest's names, sizes and order.
// Nothing is written anywhere; the caller decides where each entry goes.
type Reader struct {
	br   *bufio.Reader
	gz   *gzip.Reader
	tr   *tar.Reader
	m    Manifest
	next int
	cur  *entryReader
	done bool
}

// NewReader reads the gzip header and the manifest (the first entry) from r.
func NewReader(r io.Reader) (*Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	gz, err := gzip.NewReader(br)
	if err != nil {
		return nil, refuse("not a gzip stream: %v", err)
	}
	// One gzip member: anything after it is refused, not read as more tar.
	gz.Multistream(false)
	rd := &Reader{br: br, gz: gz, tr: tar.NewReader(gz)}
	h, err := rd.header()
	if err != nil {
		return nil, err
	}
	if h.Name != ManifestName {
		return nil, refuse("first entry is %q, want %s", clip(h.Name), ManifestName)
	}
	if h.Size > MaxManifest {
		return nil, refuse("manifest is %d bytes, over the %d this abox accepts", h.Size, MaxManifest)
	}
	b, err := io.ReadAll(rd.tr)
	if err != nil {
		return nil, truncated(ManifestName, err)
	}
	if rd.m, err = decodeManifest(b); err != nil {
		return nil, err
	}
	return rd, nil
}

// Manifest is the checked manifest.
func (r *Reader) Manifest() Manifest { return r.m }

// Next returns the next entry and a reader of exactly its bytes. After the
// last entry it returns io.EOF, once the stream has been seen to end
// cleanly (no further entry, the gzip checksum right, nothing after it).
// An entry's reader fails if the archive ends inside it.
func (r *Reader) Next() (File, io.Reader, error) {
	if r.cur != nil && r.cur.left > 0 {
		return File{}, nil, refuse("entry %s was not read to its end", r.cur.name)
	}
	if r.next == len(r.m.Files) {
		if r.done {
			return File{}, nil, io.EOF
		}
		if err := r.finish(); err != nil {
			return File{}, nil, err
		}
		r.done = true
		return File{}, nil, io.EOF
	}
	want := r.m.Files[r.next]
	h, err := r.header()
	if errors.Is(err, io.EOF) {
		return File{}, nil, refuse("archive ends before %s (truncated)", want.Name)
	}
	if err != nil {
		return File{}, nil, err
	}
	if err := checkName(h.Name); err != nil {
		return File{}, nil, err
	}
	for _, f := range r.m.Files[:r.next] {
		if f.Name == h.Name {
			return File{}, nil, refuse("entry %s appears twice", h.Name)
		}
	}
	if h.Name != want.Name {
		return File{}, nil, refuse("entry %s where the manifest lists %s next", h.Name, want.Name)
	}
	if h.Size != want.Size {
		return File{}, nil, refuse("entry %s is %d bytes, the manifest says %d", h.Name, h.Size, want.Size)
	}
	r.next++
	r.cur = &entryReader{r: r.tr, name: h.Name, left: h.Size}
	return want, r.cur, nil
}

// header reads the next tar header and refuses every kind of entry but a
// regular file, and any header field that would matter to an extractor.
func (r *Reader) header() (*tar.Header, error) {
	h, err := r.tr.Next()
	if errors.Is(err, io.EOF) {
		return nil, io.EOF
	}
	if err != nil {
		return nil, refuse("damaged or truncated tar stream: %v", err)
	}
	kind := ""
	switch h.Typeflag {
	case tar.TypeReg:
	case tar.TypeSymlink:
		kind = "a symbolic link"
	case tar.TypeLink:
		kind = "a hard link"
	case tar.TypeChar, tar.TypeBlock:
		kind = "a device"
	case tar.TypeFifo:
		kind = "a FIFO"
	case tar.TypeDir:
		kind = "a directory"
	default:
		kind = fmt.Sprintf("of tar type %q", h.Typeflag)
	}
	if kind != "" {
		return nil, refuse("entry %q is %s; an abox archive holds regular files only", clip(h.Name), kind)
	}
	// A sparse entry (PAX GNU.sparse.*; Go's reader shows it as a
	// regular file of its expanded size) turns a few bytes of map into
	// terabytes of zeros; abox's writer never makes one.
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return nil, refuse("entry %q is a sparse file; an abox archive holds regular files only", clip(h.Name))
		}
	}
	if h.Linkname != "" {
		return nil, refuse("entry %q names a link target", clip(h.Name))
	}
	if h.Size < 0 {
		return nil, refuse("entry %q has a negative size", clip(h.Name))
	}
	if err := checkName(h.Name); err != nil && h.Name != ManifestName {
		return nil, err
	}
	return h, nil
}

// finish checks that the tar stream ends after the last listed entry and
// the gzip member ends right there, its checksum verified.
func (r *Reader) finish() error {
	h, err := r.tr.Next()
	if err == nil {
		return refuse("entry %q after the last one the manifest lists", clip(h.Name))
	}
	if !errors.Is(err, io.EOF) {
		return refuse("damaged or truncated tar stream: %v", err)
	}
	// Other tar writers pad to a 10 KiB record with zeros; nothing else
	// may follow the end marker.
	var buf [4096]byte
	pad := 0
	for {
		n, err := r.gz.Read(buf[:])
		for _, c := range buf[:n] {
			if c != 0 {
				return refuse("data after the tar end marker")
			}
		}
		if pad += n; pad > 1<<20 {
			return refuse("data after the tar end marker")
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return truncated("the end of the archive", err)
		}
	}
	if _, err := r.br.ReadByte(); !errors.Is(err, io.EOF) {
		return refuse("data after the compressed stream")
	}
	return nil
}

func truncated(what string, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return refuse("archive ends inside %s (truncated)", what)
	}
	return refuse("reading %s: %v", what, err)
}

// entryReader reads one entry, turning an early end into a clear error.
type entryReader struct {
	r    io.Reader
	name string
	left int64
}

func (e *entryReader) Read(p []byte) (int, error) {
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) && e.left > 0 {
		return n, truncated(e.name, io.ErrUnexpectedEOF)
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return n, truncated(e.name, err)
	}
	if e.left == 0 {
		return n, io.EOF
	}
	return n, nil
}
