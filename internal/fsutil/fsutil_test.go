package fsutil

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteFileAtomic(p, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(p, []byte("two"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	fi, _ := os.Stat(p)
	if string(b) != "two" || fi.Mode().Perm() != 0o640 {
		t.Errorf("content %q mode %o", b, fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "f"), []byte("x"), 0o600); err == nil {
		t.Error("write into a missing directory succeeded")
	}
}

func TestWithin(t *testing.T) {
	for _, tt := range []struct {
		path, dir string
		ok        bool
	}{
		{"/a/b/c", "/a/b", true},
		{"/a/b", "/a/b", false},
		{"/a/bc", "/a/b", false},
		{"/a/b/../c", "/a/b", false},
		{"/a/b//c", "/a/b", false},
		{"b/c", "/a", false},
		{"/a/b/..c", "/a/b", true},
		{"/a/b/c", "", false},
	} {
		if got := Within(tt.path, tt.dir); got != tt.ok {
			t.Errorf("Within(%q, %q) = %v, want %v", tt.path, tt.dir, got, tt.ok)
		}
	}
}
