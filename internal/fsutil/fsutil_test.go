package fsutil

import (
	"os"
	"path/filepath"
	"strings"
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

// TestCheckExecutable: a file, or a directory above it, that another user
// could write or that another user owns is refused; /tmp's sticky bit is
// not a hole.
func TestCheckExecutable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to another owner")
	}
	base := t.TempDir() // below /tmp, 1777
	mk := func(rel string, mode os.FileMode, uid int) string {
		p := filepath.Join(base, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, -1); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := mk("good/abox", 0o755, 0)
	if err := CheckExecutable(good, 0); err != nil {
		t.Errorf("a root-owned 0755 file: %v", err)
	}
	link := filepath.Join(base, "link")
	os.Symlink(good, link)
	if err := CheckExecutable(link, 0); err != nil {
		t.Errorf("a link to a good file: %v", err)
	}
	wideDir := mk("wide/abox", 0o755, 0)
	os.Chmod(filepath.Dir(wideDir), 0o777)
	stickyDir := mk("sticky/abox", 0o755, 0)
	os.Chmod(filepath.Dir(stickyDir), os.ModeSticky|0o777)
	if err := CheckExecutable(stickyDir, 0); err != nil {
		t.Errorf("a file in a sticky directory: %v", err)
	}
	userDir := mk("user/abox", 0o755, 0)
	os.Chown(filepath.Dir(userDir), 4242, -1)
	for _, tc := range []struct{ path, want string }{
		{mk("otherw/abox", 0o757, 0), "is writable by its group or others (mode -rwxr-xrwx)"},
		{mk("groupw/abox", 0o775, 0), "is writable by its group or others"},
		{mk("all/abox", 0o777, 0), "is writable by its group or others"},
		{mk("owned/abox", 0o755, 4242), "is owned by uid 4242, not by root or uid 0"},
		{wideDir, "the directory " + filepath.Dir(wideDir) + " above it is writable by its group or others"},
		{userDir, "the directory " + filepath.Dir(userDir) + " above it is owned by uid 4242"},
		{filepath.Dir(good), "not a regular file"},
		{filepath.Join(base, "missing"), "no such file"},
	} {
		if err := CheckExecutable(tc.path, 0); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CheckExecutable(%s) = %v, want %q", tc.path, err, tc.want)
		}
	}
	// A user's own file, for that user's abox.
	if err := CheckExecutable(mk("mine/abox", 0o755, 4242), 4242); err != nil {
		t.Errorf("uid 4242's file for uid 4242: %v", err)
	}
}
