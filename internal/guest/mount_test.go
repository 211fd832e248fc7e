package guest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// sftpServer is the real sftp-server (openssh-sftp-server, installed by
// scripts/host-deps.sh); the test runs it in place of ssh, so sshfs talks
// to a real server about a directory standing in for the guest's.
const sftpServer = "/usr/lib/openssh/sftp-server"

// TestMountKeepsGuestFilesInert mounts with the real sshfs and the options
// every abox mount uses: links the "guest" made towards a host file, by
// absolute path or by "..", neither read nor overwrite it, and a guest
// executable cannot run on the host.
func TestMountKeepsGuestFilesInert(t *testing.T) {
	need.Root(t, "mounting FUSE")
	for _, tool := range []string{"sshfs", "fusermount3", sftpServer} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing (scripts/host-deps.sh installs sshfs and openssh-sftp-server): %v", tool, err)
		}
	}
	base := t.TempDir()
	guestDir := filepath.Join(base, "guest", "share")
	secret := filepath.Join(base, "host-secret")
	mnt := filepath.Join(base, "mnt")
	os.MkdirAll(guestDir, 0o755)
	os.Mkdir(mnt, 0o755)
	os.WriteFile(secret, []byte("HOST ONLY\n"), 0o600)
	os.WriteFile(filepath.Join(guestDir, "g.txt"), []byte("guest file\n"), 0o644)
	os.WriteFile(filepath.Join(guestDir, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o4755)
	os.Symlink(secret, filepath.Join(guestDir, "abs"))
	os.Symlink("../../host-secret", filepath.Join(guestDir, "rel"))
	// The stand-in for the guest's sshd: sshfs runs it instead of ssh.
	fake := filepath.Join(base, "fake-ssh")
	os.WriteFile(fake, []byte("#!/bin/sh\nexec "+sftpServer+"\n"), 0o755)
	opts := append([]string{"ssh_command=" + fake}, sshfsOptions...)
	out, err := exec.Command("sshfs", "-o", strings.Join(opts, ","), "guest:"+guestDir, mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("sshfs: %v\n%s", err, out)
	}
	defer exec.Command("fusermount3", "-u", "-z", mnt).Run()
	if b, err := os.ReadFile(filepath.Join(mnt, "g.txt")); err != nil || string(b) != "guest file\n" {
		t.Fatalf("guest file through the mount: %q, %v", b, err)
	}
	for _, link := range []string{"abs", "rel"} {
		// The stand-in guest shares the host's root, so a link resolved
		// in the "guest" reaches the secret too; what matters is that the
		// host kernel never resolves a link itself: no link shows.
		fi, err := os.Lstat(filepath.Join(mnt, link))
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(filepath.Join(mnt, link))
			t.Errorf("%s shows on the host as a symbolic link to %q, which the host kernel would follow", link, target)
		}
	}
	if out, err := exec.Command(filepath.Join(mnt, "run.sh")).CombinedOutput(); err == nil {
		t.Errorf("a guest executable ran on the host: %s", out)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "run.sh")); err == nil && fi.Mode()&os.ModeSetuid != 0 {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		if !strings.Contains(string(mi), mnt+" ") || !strings.Contains(string(mi), "nosuid") {
			t.Errorf("set-uid guest file on a mount without nosuid")
		}
	}
}

// TestMountRefusesALinkAsTheMountPoint: a repository's `mnt -> ~/.config/
// autostart` (empty, so the emptiness check passes) must not become the
// place where the guest's files appear.
func TestMountRefusesALinkAsTheMountPoint(t *testing.T) {
	tg := testTarget(t)
	target := t.TempDir()
	link := filepath.Join(t.TempDir(), "mnt")
	os.Symlink(target, link)
	err := Access{Layout: tg.Layout}.Mount(t.Context(), tg, Mount{Dir: link})
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("mount on a link: %v", err)
	}
	if ms, _ := (Access{Layout: tg.Layout}).Mounts("dev"); len(ms) != 0 {
		t.Errorf("recorded: %v", ms)
	}
}

// TestMountRefusesLinksOnTheWay: `abox mount dev:out ./mnt/` on a planted
// `mnt -> /var/spool/cron/crontabs` (empty, and the trailing slash makes
// every system call follow the link) would make the guest's files root's
// crontabs; so would a link further up the path. A mount point must be
// reached without any link: its real path is its clean path.
func TestMountRefusesLinksOnTheWay(t *testing.T) {
	tg := testTarget(t)
	// A stand-in sshfs that mounts nothing: it says where it was asked to.
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "sshfs"), []byte("#!/bin/sh\nfor a; do last=$a; done\necho \"sshfs ran on $last\" >&2\nexit 1\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	crontabs := t.TempDir() // empty, like /var/spool/cron/crontabs
	spool := t.TempDir()
	os.Mkdir(filepath.Join(spool, "mnt"), 0o755)
	repo := t.TempDir()
	t.Chdir(repo)
	os.Symlink(crontabs, "mnt")
	os.Symlink(spool, "spool")
	os.MkdirAll(filepath.Join("real", "mnt"), 0o755)
	for _, tc := range []struct{ dir, link string }{
		{"./mnt/", "./mnt"},
		{"mnt", "mnt"},
		{"spool/mnt/", "spool"},
		{"real/../spool/mnt", "spool"},
		{filepath.Join(repo, "spool", "mnt"), filepath.Join(repo, "spool")},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			err := Access{Layout: tg.Layout}.Mount(t.Context(), tg, Mount{Dir: tc.dir})
			if err == nil || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), tc.link) {
				t.Errorf("mount on %s: %v, want the link %s refused", tc.dir, err, tc.link)
			}
			if ms, _ := (Access{Layout: tg.Layout}).Mounts("dev"); len(ms) != 0 {
				t.Errorf("recorded: %v", ms)
			}
		})
	}
	for _, tc := range []struct{ dir, want string }{
		{"real/mnt/", filepath.Join(repo, "real", "mnt")},
		{"./real/../real/mnt", filepath.Join(repo, "real", "mnt")},
		{filepath.Join(repo, "real", "mnt") + "/", filepath.Join(repo, "real", "mnt")},
	} {
		if got, err := mountPoint(tc.dir); err != nil || got != tc.want {
			t.Errorf("mountPoint(%q) = %q, %v; want %q", tc.dir, got, err, tc.want)
		}
	}
	// Past the check, the real directory goes to sshfs as it is.
	err := Access{Layout: tg.Layout}.Mount(t.Context(), tg, Mount{Dir: "real/mnt/"})
	if want := "sshfs ran on " + filepath.Join(repo, "real", "mnt"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("mount on real/mnt/: %v, want %q", err, want)
	}
}
