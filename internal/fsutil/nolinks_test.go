package fsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenRootNoLinks: a link anywhere in the path is refused, named by
// the part of the path that is the link, whether it is the last
// component, the last with a trailing slash (which makes every system
// call follow it), or one on the way; the walk starts at the working
// directory for a relative path and at / for an absolute one.
func TestOpenRootNoLinks(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	work := filepath.Join(base, "work")
	for _, d := range []string{filepath.Join(outside, "sub"), filepath.Join(work, "real", "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(work, "file"), nil, 0o644)
	os.Symlink(outside, filepath.Join(work, "results"))
	os.Symlink("real", filepath.Join(work, "inside"))
	os.Symlink(outside, filepath.Join(work, "real", "sub", "deep"))
	t.Chdir(work)

	for _, tc := range []struct {
		path string
		link string // the link named, "" for success
		real string // Name of the root on success, relative to base
	}{
		{path: "real", real: "work/real"},
		{path: "./real/", real: "work/real"},
		{path: "real/sub//", real: "work/real/sub"},
		{path: ".", real: "work"},
		{path: "real/sub/../..", real: "work"},
		{path: "..", real: "."},
		{path: filepath.Join(work, "real") + "/", real: "work/real"},
		{path: "results", link: "results"},
		{path: "./results/", link: "./results"},
		{path: "results/sub", link: "results"},
		{path: "results/../real", link: "results"},
		{path: "inside/", link: "inside"}, // a link inside the tree is a link too
		{path: "real/sub/deep/", link: "real/sub/deep"},
		{path: filepath.Join(work, "results") + "/sub/", link: filepath.Join(work, "results")},
	} {
		t.Run(tc.path, func(t *testing.T) {
			r, err := OpenRootNoLinks(tc.path)
			if tc.link == "" {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				defer r.Close()
				if want := filepath.Join(base, tc.real); r.Name() != want {
					t.Errorf("Name = %q, want %q", r.Name(), want)
				}
				return
			}
			if err == nil {
				r.Close()
				t.Fatalf("opened %s through a link", r.Name())
			}
			var le *LinkError
			if !errors.As(err, &le) || le.Link != tc.link || le.Path != tc.path {
				t.Fatalf("err = %#v (%v), want a *LinkError at %q", err, err, tc.link)
			}
			if !strings.Contains(err.Error(), "symbolic link") {
				t.Errorf("message %q", err)
			}
		})
	}
	if _, err := OpenRootNoLinks("missing/x"); !errors.Is(err, fs.ErrNotExist) || IsLink(err) {
		t.Errorf("missing: %v", err)
	}
	if _, err := OpenRootNoLinks("file/"); err == nil || IsLink(err) {
		t.Errorf("a file: %v", err)
	}
}

// TestLinkErrorIsSafeToPrint: link names and targets come from a
// repository; their control characters reach the terminal escaped.
func TestLinkErrorIsSafeToPrint(t *testing.T) {
	t.Chdir(t.TempDir())
	name := "r\x1b]0;owned\x07"
	os.Symlink("/etc/\x1b[2J", name)
	_, err := OpenRootNoLinks(name + "/")
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\x07") {
		t.Errorf("err = %q", err)
	}
}
