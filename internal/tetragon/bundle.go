// Package tetragon gets Cilium Tetragon to a monitored guest: it checks an
// agent bundle (a tarball in the layout of upstream's install/linux-tarball)
// before abox hands it to the guest's root, and downloads and verifies the
// pinned upstream release for hosts with internet.
package tetragon

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"syscall"
)

// Where upstream's linux-tarball puts the agent (below an optional single
// top directory such as tetragon-v1.7.1-amd64/).
const (
	BinaryPath = "usr/local/bin/tetragon"
	CLIPath    = "usr/local/bin/tetra"
	BPFDir     = "usr/local/lib/tetragon/bpf"
)

// Caps on what a bundle may hold. Upstream's v1.7 tarball is about 80 MB
// compressed and 250 MiB unpacked (LAB.md).
const (
	MaxCompressed = 512 << 20
	MaxUnpacked   = 1 << 30
	MaxFile       = 512 << 20
	MaxEntries    = 20000
)

// Info is what validation learnt about a bundle.
type Info struct {
	// SHA256 is the hex digest of the file as given (compressed).
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Prefix is the single top directory the layout sits below, or "".
	Prefix string `json:"prefix,omitempty"`
	// Entries, Unpacked and BPFObjects describe the content.
	Entries    int   `json:"entries"`
	Unpacked   int64 `json:"unpacked"`
	BPFObjects int   `json:"bpf_objects"`
	HasCLI     bool  `json:"has_cli"`
}

// BundleError is a bundle abox refuses; Reason names the problem.
type BundleError struct {
	File, Reason string
}

func (e *BundleError) Error() string {
	return fmt.Sprintf("monitor bundle %s: %s (want a .tar.gz in the layout of Tetragon's install/linux-tarball: usr/local/bin/tetragon and BPF objects in usr/local/lib/tetragon/bpf)", e.File, e.Reason)
}

// ValidateFile checks the bundle at file; see Validate.
func ValidateFile(file string) (Info, error) {
	f, err := openBundle(file, file)
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	return Validate(f, file)
}

// openBundle opens a regular file of at most MaxCompressed bytes (and never
// blocks on a FIFO); name is the bundle in errors.
func openBundle(file, name string) (*os.File, error) {
	f, err := os.OpenFile(file, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, &BundleError{name, err.Error()}
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
		err = &BundleError{name, err.Error()}
	case !fi.Mode().IsRegular():
		err = &BundleError{name, "not a regular file"}
	case fi.Size() > MaxCompressed:
		err = &BundleError{name, fmt.Sprintf("%d bytes; at most %d", fi.Size(), MaxCompressed)}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Validate reads a gzip-compressed tarball from r and refuses anything a
// guest's root should not unpack: absolute names, "..", names twice, links
// that could point outside the bundle, device files, FIFOs, set-id bits,
// more than the caps; and a bundle without the tetragon binary (an ELF) or
// without BPF objects. name is used in errors.
func Validate(r io.Reader, name string) (Info, error) {
	bad := func(format string, a ...any) (Info, error) {
		return Info{}, &BundleError{name, fmt.Sprintf(format, a...)}
	}
	h := sha256.New()
	counted := &countingReader{r: io.LimitReader(r, MaxCompressed+1)}
	zr, err := gzip.NewReader(io.TeeReader(counted, h))
	if err != nil {
		return bad("not gzip-compressed: %v", err)
	}
	// Multistream, as gzip -d in the guest reads it: a second member
	// appended to the file is part of what is checked.
	tr := tar.NewReader(zr)
	var info Info
	kinds := map[string]byte{}
	var elf []byte
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return bad("not a readable tar archive: %v", err)
		}
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		info.Entries++
		if info.Entries > MaxEntries {
			return bad("more than %d entries", MaxEntries)
		}
		n, err := entryName(hdr.Name)
		if err != nil {
			return bad("entry %q: %v", hdr.Name, err)
		}
		if n == "." {
			// "./", which `tar -C DIR -c .` writes first.
			if hdr.Typeflag != tar.TypeDir {
				return bad("entry %q names the bundle's root", hdr.Name)
			}
			continue
		}
		if _, dup := kinds[n]; dup {
			return bad("entry %q appears twice", hdr.Name)
		}
		for k := range hdr.PAXRecords {
			if strings.HasPrefix(k, "GNU.sparse.") {
				// Holes the guest's tar would fill: a small archive,
				// a file as large as it claims.
				return bad("entry %q is a sparse file", hdr.Name)
			}
		}
		if hdr.Mode&(0o4000|0o2000) != 0 {
			return bad("entry %q has a set-user or set-group id bit", hdr.Name)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
		case tar.TypeReg, tar.TypeRegA:
			if hdr.Size > MaxFile {
				return bad("entry %q is %d bytes; at most %d", hdr.Name, hdr.Size, MaxFile)
			}
			info.Unpacked += hdr.Size
			if info.Unpacked > MaxUnpacked {
				return bad("more than %d bytes unpacked", MaxUnpacked)
			}
		case tar.TypeSymlink:
			// Relative and without "..": a link can only point below its
			// own directory, so no chain of links leaves the bundle.
			t := hdr.Linkname
			if t == "" || strings.HasPrefix(t, "/") || strings.ContainsRune(t, 0) || hasDotDot(t) {
				return bad("symbolic link %q -> %q could point outside the bundle", hdr.Name, t)
			}
		case tar.TypeLink:
			t, err := entryName(hdr.Linkname)
			if err != nil || kinds[t] != tar.TypeReg {
				return bad("hard link %q -> %q does not name a file earlier in the bundle", hdr.Name, hdr.Linkname)
			}
		case tar.TypeChar, tar.TypeBlock:
			return bad("entry %q is a device file", hdr.Name)
		case tar.TypeFifo:
			return bad("entry %q is a FIFO", hdr.Name)
		default:
			return bad("entry %q has tar type %q, which a bundle has no use for", hdr.Name, hdr.Typeflag)
		}
		kind := hdr.Typeflag
		if kind == tar.TypeRegA {
			kind = tar.TypeReg
		}
		kinds[n] = kind
		if kind == tar.TypeReg && (n == BinaryPath || strings.HasSuffix(n, "/"+BinaryPath)) {
			elf = make([]byte, 4)
			if _, err := io.ReadFull(tr, elf); err != nil {
				elf = nil
			}
		}
	}
	// After the end-of-archive marker only zero padding may follow: the
	// guest's tar must not find more than was checked here. Reading to the
	// end also makes the digest cover the whole file.
	if _, err := io.Copy(nonZero{}, zr); err != nil {
		if errors.Is(err, errTrailing) {
			return bad("data after the end of the tar archive")
		}
		return bad("corrupt gzip stream: %v", err)
	}
	if _, err := io.Copy(io.Discard, io.TeeReader(counted, h)); err != nil {
		return bad("%v", err)
	}
	if counted.n > MaxCompressed {
		return bad("more than %d bytes", MaxCompressed)
	}
	info.Size = counted.n
	info.SHA256 = hex.EncodeToString(h.Sum(nil))
	info.Prefix = layoutPrefix(kinds)
	if strings.Trim(info.Prefix, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") != "" {
		return bad("top directory %q: want letters, digits and ._+- only", info.Prefix)
	}
	bin := path.Join(info.Prefix, BinaryPath)
	if kinds[bin] != tar.TypeReg {
		return bad("no %s (a regular file) in it", BinaryPath)
	}
	if !bytes.Equal(elf, []byte("\x7fELF")) {
		return bad("%s is not an ELF executable", bin)
	}
	bpf := path.Join(info.Prefix, BPFDir) + "/"
	for n, k := range kinds {
		if k == tar.TypeReg && strings.HasPrefix(n, bpf) && strings.HasSuffix(n, ".o") {
			info.BPFObjects++
		}
	}
	if info.BPFObjects == 0 {
		return bad("no BPF objects (*.o) in %s", BPFDir)
	}
	info.HasCLI = kinds[path.Join(info.Prefix, CLIPath)] == tar.TypeReg
	return info, nil
}

// entryName is a tar name cleaned to a local slash path ("./a/b/" -> "a/b").
func entryName(s string) (string, error) {
	if s == "" || strings.ContainsRune(s, 0) {
		return "", errors.New("empty name or a NUL in it")
	}
	if strings.HasPrefix(s, "/") {
		return "", errors.New("absolute name")
	}
	if strings.ContainsRune(s, '\\') {
		return "", errors.New("backslash in the name")
	}
	if hasDotDot(s) {
		return "", errors.New(`".." in the name`)
	}
	return path.Clean(s), nil
}

func hasDotDot(s string) bool {
	for _, c := range strings.Split(s, "/") {
		if c == ".." {
			return true
		}
	}
	return false
}

// layoutPrefix is the single top directory every entry sits below when the
// agent is not at the top (upstream's tetragon-VERSION-ARCH/), else "".
func layoutPrefix(kinds map[string]byte) string {
	if _, ok := kinds[BinaryPath]; ok {
		return ""
	}
	top := ""
	for n := range kinds {
		first, _, _ := strings.Cut(n, "/")
		if top != "" && first != top {
			return ""
		}
		top = first
	}
	return top
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

var errTrailing = errors.New("trailing data")

// nonZero is a writer that refuses anything but zero bytes.
type nonZero struct{}

func (nonZero) Write(p []byte) (int, error) {
	for _, b := range p {
		if b != 0 {
			return 0, errTrailing
		}
	}
	return len(p), nil
}
