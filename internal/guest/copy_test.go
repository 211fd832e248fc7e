package guest

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// sftpGuest stands a directory in for the guest: scp's -S program is a
// script that ignores its ssh arguments and runs the real sftp-server in
// that directory, so the real scp really copies (SFTP, as abox's -s asks).
func sftpGuest(t *testing.T, reserve *int64) (guestDir string, copy func(p CopyPlan) error) {
	t.Helper()
	scp := need.Program(t, "scp")
	server := need.Program(t, sftpServer)
	guestDir = t.TempDir()
	fake := filepath.Join(t.TempDir(), "ssh")
	os.WriteFile(fake, []byte("#!/bin/sh\nexec "+server+" -d "+guestDir+"\n"), 0o755)
	tg := testTarget(t)
	return guestDir, func(p CopyPlan) error {
		var errOut bytes.Buffer
		err := copier{scp: scp, extra: []string{"-S", fake}, reserve: *reserve}.copy(t.Context(), tg, p, &errOut, &errOut)
		if err != nil && errOut.Len() > 0 {
			t.Logf("scp: %s", errOut.String())
		}
		return err
	}
}

func write(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func read(p string) string { b, _ := os.ReadFile(p); return string(b) }

// TestCopyOutNeverWritesThroughLinks: the guest names the files that come
// back, and a repository can plant a link where one lands (out/report.txt
// -> ~/.bashrc); the copy must not write through it, nor anywhere outside
// the destination, and what the guest made set-uid arrives inert.
func TestCopyOutNeverWritesThroughLinks(t *testing.T) {
	var reserve int64 = 1
	g, copy := sftpGuest(t, &reserve)
	write(t, filepath.Join(g, "out", "report.txt"), "guest report\n", 0o644)
	write(t, filepath.Join(g, "out", "sub", "tool"), "#!/bin/sh\n", 0o755)
	os.Chmod(filepath.Join(g, "out", "sub", "tool"), 0o4755)

	host := t.TempDir()
	victim := filepath.Join(t.TempDir(), "bashrc")
	write(t, victim, "host file\n", 0o644)

	t.Run("a planted link where a file lands", func(t *testing.T) {
		dest := filepath.Join(host, "a")
		os.MkdirAll(filepath.Join(dest, "out"), 0o755)
		os.Symlink(victim, filepath.Join(dest, "out", "report.txt"))
		err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out"}}, Dest: Location{Path: dest}, Recursive: true})
		if err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("err = %v, want the link refused", err)
		}
		if got := read(victim); got != "host file\n" {
			t.Errorf("the host file behind the link now holds %q", got)
		}
		if m, _ := filepath.Glob(filepath.Join(dest, ".abox-scp-*")); len(m) != 0 {
			t.Errorf("staging left behind: %v", m)
		}
	})
	t.Run("a planted link as a directory on the way", func(t *testing.T) {
		dest := filepath.Join(host, "b")
		os.MkdirAll(dest, 0o755)
		os.Symlink(filepath.Dir(victim), filepath.Join(dest, "out"))
		err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out"}}, Dest: Location{Path: dest}, Recursive: true})
		if err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("err = %v, want the link refused", err)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(victim), "report.txt")); err == nil {
			t.Error("the copy went through the link")
		}
	})
	t.Run("a destination that is a link", func(t *testing.T) {
		link := filepath.Join(host, "c")
		os.Symlink(filepath.Dir(victim), link)
		err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out/report.txt"}}, Dest: Location{Path: link}})
		if err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("a new directory, an existing one, a file over a file", func(t *testing.T) {
		dest := filepath.Join(host, "d")
		if err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out"}}, Dest: Location{Path: dest}, Recursive: true}); err != nil {
			t.Fatal(err)
		}
		if got := read(filepath.Join(dest, "report.txt")); got != "guest report\n" {
			t.Errorf("new directory: report = %q", got)
		}
		fi, err := os.Stat(filepath.Join(dest, "sub", "tool"))
		if err != nil || fi.Mode()&os.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
			t.Errorf("set-uid file from the guest: %v %v", fi.Mode(), err)
		}
		if err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out"}}, Dest: Location{Path: dest}, Recursive: true}); err != nil {
			t.Fatal(err)
		}
		if got := read(filepath.Join(dest, "out", "report.txt")); got != "guest report\n" {
			t.Errorf("into an existing directory: %q", got)
		}
		file := filepath.Join(host, "e.txt")
		write(t, file, "old\n", 0o644)
		if err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "out/report.txt"}}, Dest: Location{Path: file}}); err != nil {
			t.Fatal(err)
		}
		if got := read(file); got != "guest report\n" {
			t.Errorf("file over a file: %q", got)
		}
		entries, _ := os.ReadDir(host)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".abox-scp-") {
				t.Errorf("staging left behind: %s", e.Name())
			}
		}
	})
}

// TestCopyInRefusesLinksOutOfTheTree: scp -r follows links, so a
// repository's `notes -> ~/.ssh/id_ed25519` would put a host secret in the
// guest when the user copies the repository in.
func TestCopyInRefusesLinksOutOfTheTree(t *testing.T) {
	var reserve int64 = 1
	g, copy := sftpGuest(t, &reserve)
	secret := filepath.Join(t.TempDir(), "id_ed25519")
	write(t, secret, "HOST SECRET\n", 0o600)
	repo := filepath.Join(t.TempDir(), "repo")
	write(t, filepath.Join(repo, "main.go"), "package main\n", 0o644)
	write(t, filepath.Join(repo, "docs", "a.md"), "doc\n", 0o644)
	os.Symlink("docs/a.md", filepath.Join(repo, "README.md")) // inside: fine
	os.Symlink(secret, filepath.Join(repo, "docs", "notes"))
	err := copy(CopyPlan{Sources: []Location{{Path: repo}}, Dest: Location{Instance: "dev", Path: "work"}, Recursive: true})
	if err == nil || !strings.Contains(err.Error(), "outside") || !strings.Contains(err.Error(), filepath.Join("docs", "notes")) {
		t.Errorf("err = %v, want the link out of the tree refused", err)
	}
	filepath.Walk(g, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() && strings.Contains(read(p), "HOST SECRET") {
			t.Errorf("the host secret reached the guest at %s", p)
		}
		return nil
	})
	// A shell glob names the planted link on its own: repo/*.
	err = copy(CopyPlan{Sources: []Location{{Path: filepath.Join(repo, "main.go")}, {Path: filepath.Join(repo, "docs", "notes")}}, Dest: Location{Instance: "dev", Path: "work"}})
	if err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("a named link out of its directory: %v", err)
	}
	if got := read(filepath.Join(g, "work", "notes")); strings.Contains(got, "HOST SECRET") {
		t.Error("the host secret reached the guest through a named link")
	}
	if err := copy(CopyPlan{Sources: []Location{{Path: filepath.Join(repo, "README.md")}}, Dest: Location{Instance: "dev", Path: "readme"}}); err != nil {
		t.Errorf("a named link within its directory: %v", err)
	}
	os.Symlink("/nonexistent/x", filepath.Join(repo, "dangling"))
	os.Remove(filepath.Join(repo, "docs", "notes"))
	if err := copy(CopyPlan{Sources: []Location{{Path: repo}}, Dest: Location{Instance: "dev", Path: "work"}, Recursive: true}); err == nil {
		t.Error("a dangling link was accepted")
	}
	os.Remove(filepath.Join(repo, "dangling"))
	// Links to the tree's own directories are refused before anything is
	// sent (an scp that follows them copies the tree into itself).
	for _, l := range []struct{ at, to string }{{"loop", "."}, {"docs/up", ".."}} {
		os.Symlink(l.to, filepath.Join(repo, l.at))
		if err := copy(CopyPlan{Sources: []Location{{Path: repo}}, Dest: Location{Instance: "dev", Path: "work"}, Recursive: true}); err == nil || !strings.Contains(err.Error(), "into itself") {
			t.Errorf("link %s -> %s: %v", l.at, l.to, err)
		}
		os.Remove(filepath.Join(repo, l.at))
	}
	if err := copy(CopyPlan{Sources: []Location{{Path: repo}}, Dest: Location{Instance: "dev", Path: "work"}, Recursive: true}); err != nil {
		t.Fatalf("a tree with a link inside it: %v", err)
	}
	if got := read(filepath.Join(g, "work", "README.md")); got != "doc\n" {
		t.Errorf("in the guest: README.md = %q", got)
	}
}

// TestCopyOutStopsBeforeTheHostDiskFills: the guest decides how much
// arrives (a sparse file costs it nothing); the copy stops once the host's
// file system would drop below the reserve, and keeps nothing.
func TestCopyOutStopsBeforeTheHostDiskFills(t *testing.T) {
	var reserve int64 = 1
	g, copy := sftpGuest(t, &reserve)
	f, err := os.Create(filepath.Join(g, "huge.bin"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(256 << 20) // sparse in the guest, written out in full on the host
	f.Close()
	host := t.TempDir()
	free, err := fsutil.FreeBytes(host)
	if err != nil {
		t.Fatal(err)
	}
	if free < 1<<30 {
		t.Skipf("only %d bytes free here", free)
	}
	reserve = free - 16<<20 // room for 16 MiB of the 256
	err = copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "huge.bin"}}, Dest: Location{Path: host}})
	if !errors.Is(err, ErrHostDiskFull) {
		t.Errorf("err = %v, want %v", err, ErrHostDiskFull)
	}
	if entries, _ := os.ReadDir(host); len(entries) != 0 {
		t.Errorf("left on the host: %v", entries)
	}
	reserve = 1
	if err := copy(CopyPlan{Sources: []Location{{Instance: "dev", Path: "huge.bin"}}, Dest: Location{Path: host}}); err != nil {
		t.Fatalf("with room: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(host, "huge.bin")); err != nil || fi.Size() != 256<<20 {
		t.Errorf("copied: %v %v", fi, err)
	}
}

// tree lists the entries under dir (relative, sorted by the walk), so a
// test can say nothing arrived there.
func tree(dir string) []string {
	var got []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != dir {
			got = append(got, strings.TrimPrefix(p, dir+"/"))
		}
		return nil
	})
	return got
}

// TestCopyOutRefusesLinksOnTheWay: a repository that ships `results ->
// /etc` gets nothing written there by `abox scp -r dev:out ./results/`
// (shell completion adds the slash, which makes every system call follow
// the link), nor by `./results/authorized_keys`, nor through a link
// further up or one planted in the middle of the destination's tree;
// the real directory beside them takes the copy, and nothing is left
// half-made.
func TestCopyOutRefusesLinksOnTheWay(t *testing.T) {
	var reserve int64 = 1
	g, copy := sftpGuest(t, &reserve)
	write(t, filepath.Join(g, "out", "cron.d", "job"), "* * * * * root guest\n", 0o644)
	write(t, filepath.Join(g, "out", "report.txt"), "guest report\n", 0o644)
	write(t, filepath.Join(g, "authorized_keys"), "ssh-ed25519 GUEST\n", 0o644)

	etc := t.TempDir() // stands in for /etc: must stay as it is
	os.Mkdir(filepath.Join(etc, "cron.d"), 0o755)
	os.Mkdir(filepath.Join(etc, "out"), 0o755)
	os.Mkdir(filepath.Join(etc, "sub"), 0o755)
	before := tree(etc)
	repo := t.TempDir()
	t.Chdir(repo)
	os.Symlink(etc, "results")
	os.MkdirAll("a", 0o755)
	os.Symlink(etc, filepath.Join("a", "up"))
	os.MkdirAll(filepath.Join("planted", "out"), 0o755)
	os.Symlink(filepath.Join(etc, "cron.d"), filepath.Join("planted", "out", "cron.d"))
	os.MkdirAll("real", 0o755)

	recursive := func(dest string) CopyPlan {
		return CopyPlan{Sources: []Location{{Instance: "dev", Path: "out"}}, Dest: Location{Path: dest}, Recursive: true}
	}
	keys := func(dest string) CopyPlan {
		return CopyPlan{Sources: []Location{{Instance: "dev", Path: "authorized_keys"}}, Dest: Location{Path: dest}}
	}
	for _, tc := range []struct {
		name string
		plan CopyPlan
		link string // named in the error
	}{
		{"a trailing slash on a link", recursive("./results/"), "./results"},
		{"a link without the slash", recursive("./results"), "./results"},
		{"a file under a link", keys("./results/authorized_keys"), "./results"},
		{"a new file under a link", keys("results/new/authorized_keys"), "results"},
		{"a link further up", recursive("a/up/sub/"), "a/up"},
		{"a link further up, absolute", keys(filepath.Join(repo, "a", "up", "authorized_keys")), filepath.Join(repo, "a", "up")},
		{"a link planted mid-tree", recursive("planted/"), "planted/out/cron.d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := copy(tc.plan)
			if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), tc.link) {
				t.Errorf("err = %v, want the link %s refused", err, tc.link)
			}
			if got := tree(etc); !slices.Equal(got, before) {
				t.Errorf("the link's target now holds %v, want %v", got, before)
				for _, p := range got {
					if !slices.Contains(before, p) {
						os.RemoveAll(filepath.Join(etc, p))
					}
				}
			}
			for _, dir := range []string{repo, etc} {
				for _, p := range tree(dir) {
					if strings.Contains(p, ".abox-scp-") {
						t.Errorf("staging left behind: %s", p)
					}
				}
			}
		})
	}
	t.Run("the real directory, with and without a slash", func(t *testing.T) {
		if err := copy(recursive("./real/")); err != nil {
			t.Fatal(err)
		}
		if err := copy(keys("real/out/")); err != nil {
			t.Fatal(err)
		}
		if err := copy(keys("real/out/cron.d/keys")); err != nil {
			t.Fatal(err)
		}
		want := []string{"out", "out/authorized_keys", "out/cron.d", "out/cron.d/job", "out/cron.d/keys", "out/report.txt"}
		if got := tree("real"); !slices.Equal(got, want) {
			t.Errorf("real holds %v, want %v", got, want)
		}
	})
	t.Run("a trailing slash on a missing directory", func(t *testing.T) {
		if err := copy(keys("missing/")); err == nil {
			t.Error("copied to missing/")
		}
		if _, err := os.Lstat("missing"); err == nil {
			t.Error("missing/ was made as a file")
		}
	})
}

// TestCopyInRefusesSourcesThroughLinks: `abox scp -r repo/docs/ dev:`
// with a planted `docs -> ~/.ssh` would hand the guest the user's keys
// (the slash makes scp follow the link the old check looked past), and
// so would naming a file under the link; a link in the middle of the
// tree is refused as before.
func TestCopyInRefusesSourcesThroughLinks(t *testing.T) {
	var reserve int64 = 1
	g, copy := sftpGuest(t, &reserve)
	ssh := t.TempDir() // stands in for ~/.ssh
	write(t, filepath.Join(ssh, "id_ed25519"), "HOST SECRET\n", 0o600)
	repo := t.TempDir()
	t.Chdir(repo)
	write(t, filepath.Join("repo", "real", "a.md"), "doc\n", 0o644)
	os.Symlink(ssh, filepath.Join("repo", "docs"))
	os.Symlink("real", filepath.Join("repo", "alias"))
	write(t, filepath.Join("repo2", "src", "main.go"), "package main\n", 0o644)
	os.Symlink(ssh, filepath.Join("repo2", "src", "keys"))

	for _, tc := range []struct {
		name string
		plan CopyPlan
		want string // in the error
	}{
		{"a trailing slash on a link", CopyPlan{Sources: []Location{{Path: "repo/docs/"}}, Dest: Location{Instance: "dev", Path: "w1"}, Recursive: true}, "repo/docs"},
		{"a link without the slash", CopyPlan{Sources: []Location{{Path: "repo/docs"}}, Dest: Location{Instance: "dev", Path: "w2"}, Recursive: true}, "repo/docs"},
		{"a file under a link", CopyPlan{Sources: []Location{{Path: "repo/docs/id_ed25519"}}, Dest: Location{Instance: "dev", Path: "w3"}}, "repo/docs"},
		{"a file under a link, absolute", CopyPlan{Sources: []Location{{Path: filepath.Join(repo, "repo", "docs", "id_ed25519")}}, Dest: Location{Instance: "dev", Path: "w4"}}, filepath.Join(repo, "repo", "docs")},
		{"a link to within, then out", CopyPlan{Sources: []Location{{Path: "repo/alias/../docs/id_ed25519"}}, Dest: Location{Instance: "dev", Path: "w5"}}, "repo/alias"},
		{"a link mid-tree", CopyPlan{Sources: []Location{{Path: "repo2/"}}, Dest: Location{Instance: "dev", Path: "w6"}, Recursive: true}, filepath.Join("repo2", "src", "keys")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := copy(tc.plan)
			if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %s refused", err, tc.want)
			}
			filepath.Walk(filepath.Join(g, tc.plan.Dest.Path), func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() && strings.Contains(read(p), "HOST SECRET") {
					t.Errorf("the host secret reached the guest at %s", p)
				}
				return nil
			})
		})
	}
	t.Run("a link within its directory, with a slash", func(t *testing.T) {
		if err := copy(CopyPlan{Sources: []Location{{Path: "repo/alias/"}}, Dest: Location{Instance: "dev", Path: "ok"}, Recursive: true}); err != nil {
			t.Fatal(err)
		}
		if got := read(filepath.Join(g, "ok", "a.md")); got != "doc\n" {
			t.Errorf("in the guest: %q", got)
		}
	})
}

func TestSplitLast(t *testing.T) {
	for _, tc := range []struct{ in, dir, name string }{
		{"a", ".", "a"},
		{"a/", ".", "a"},
		{"./a//", ".", "a"},
		{"a/b", "a", "b"},
		{"a//b/", "a", "b"},
		{"/a", "/", "a"},
		{"/a/b/", "/a", "b"},
		{"/", "/", ""},
		{".", ".", ""},
		{"a/..", "a/..", ""},
		{"../", "../", ""},
	} {
		if dir, name := splitLast(tc.in); dir != tc.dir || name != tc.name {
			t.Errorf("splitLast(%q) = %q, %q; want %q, %q", tc.in, dir, name, tc.dir, tc.name)
		}
	}
}
