// Package tetragontest builds small agent bundles for tests.
package tetragontest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"slices"
	"strings"
)

// Agent is the least a bundle needs to pass tetragon.Validate.
var Agent = map[string]string{
	"usr/local/bin/tetragon":                  "\x7fELF agent",
	"usr/local/lib/tetragon/bpf/bpf_execve.o": "obj",
}

// Tarball is a gzip tarball of name -> body, in name order; a body
// "->TARGET" is a symbolic link to TARGET.
func Tarball(files map[string]string) []byte {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		body := files[name]
		h := &tar.Header{Name: name, Mode: 0o755, Typeflag: tar.TypeReg, Size: int64(len(body))}
		if target, ok := strings.CutPrefix(body, "->"); ok {
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, target, 0
		}
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(raw.Bytes())
	zw.Close()
	return out.Bytes()
}
