package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRecipeHash(t *testing.T) {
	a := Debian12Recipe()
	if a.Hash() != Debian12Recipe().Hash() {
		t.Fatal("recipe hash is not stable")
	}
	b := Debian12Recipe()
	b.Packages = append(b.Packages, "vim")
	c := Debian12Recipe()
	c.Files["/etc/hosts"] += "# changed\n"
	for name, r := range map[string]Recipe{"packages": b, "files": c} {
		if r.Hash() == a.Hash() {
			t.Errorf("changing %s kept the hash %s", name, a.Hash())
		}
	}
}

func TestDebian12RecipeHasLABRequirements(t *testing.T) {
	r := Debian12Recipe()
	for _, p := range []string{"python3-cffi-backend", "cloud-init", "openssh-server", "linux-image-amd64", "sudo", "systemd-resolved", "udev"} {
		if !slices.Contains(r.Packages, p) {
			t.Errorf("recipe lacks package %s", p)
		}
	}
	if !strings.Contains(r.Files["/etc/cloud/cloud.cfg.d/90_abox.cfg"], "datasource_list: [ NoCloud, None ]") {
		t.Error("cloud.cfg.d does not pin the NoCloud datasource")
	}
	if r.Cmdline != "console=ttyS0 root=/dev/vda rw net.ifnames=0 no_timer_check" {
		t.Errorf("cmdline = %q", r.Cmdline)
	}
}

func TestBuild(t *testing.T) {
	ctx := context.Background()
	cache := t.TempDir()
	var seen map[string]string
	run := &fakeRunner{atMke2fs: func(root string) error {
		seen = map[string]string{}
		for _, p := range []string{"etc/ssh/ssh_host_ed25519_key", "usr/share/doc/bash/README", "var/cache/apt/archives/a.deb"} {
			if _, err := os.Lstat(filepath.Join(root, p)); err == nil {
				seen[p] = "present"
			}
		}
		target, err := os.Readlink(filepath.Join(root, "etc/resolv.conf"))
		seen["resolv.conf"] = fmt.Sprintf("%s %v", target, err)
		for _, p := range []string{"etc/hosts", "etc/machine-id", "etc/cloud/cloud.cfg.d/90_abox.cfg"} {
			b, err := os.ReadFile(filepath.Join(root, p))
			if err != nil {
				return err
			}
			seen[p] = string(b)
		}
		return nil
	}}
	b := Builder{Run: run}
	var stages []string
	bt, err := b.BuildDebian12(ctx, "", cache, func(stage string, _, _ int64) { stages = append(stages, stage) })
	if err != nil {
		t.Fatal(err)
	}
	r := Debian12Recipe()
	if bt.Cached || bt.Dir != filepath.Join(cache, r.Hash()) {
		t.Errorf("build = %+v, want a fresh build in %s", bt, filepath.Join(cache, r.Hash()))
	}
	if k, _ := os.ReadFile(bt.Kernel); string(k) != "kernel" {
		t.Errorf("kernel = %q, want the newest (6.1.0-18)", k)
	}
	if k, _ := os.ReadFile(bt.Initrd); string(k) != "initrd" {
		t.Errorf("initrd = %q, want the newest's", k)
	}
	if bt.Cmdline != Debian12Cmdline {
		t.Errorf("cmdline = %q", bt.Cmdline)
	}
	want := "unshare --mount --propagation private debootstrap --variant=minbase --include=" + strings.Join(r.Packages, ",") + " bookworm "
	if run.called(want) != 1 || run.called("unshare") != 1 {
		t.Errorf("calls = %q, want one %q", run.calls, want)
	}
	if !strings.HasSuffix(strings.Fields(run.calls[0])[len(strings.Fields(run.calls[0]))-1], DefaultMirror) {
		t.Errorf("debootstrap call %q does not use the default mirror", run.calls[0])
	}
	for _, p := range []string{"etc/ssh/ssh_host_ed25519_key", "usr/share/doc/bash/README", "var/cache/apt/archives/a.deb"} {
		if seen[p] != "" {
			t.Errorf("%s is still in the image", p)
		}
	}
	if seen["resolv.conf"] != "../run/systemd/resolve/stub-resolv.conf <nil>" {
		t.Errorf("resolv.conf: %s, want a link to resolved's stub", seen["resolv.conf"])
	}
	if seen["etc/machine-id"] != "" || !strings.Contains(seen["etc/hosts"], "localhost") {
		t.Errorf("machine-id %q, hosts %q; want empty and localhost", seen["etc/machine-id"], seen["etc/hosts"])
	}
	if !strings.Contains(seen["etc/cloud/cloud.cfg.d/90_abox.cfg"], "NoCloud") {
		t.Errorf("cloud.cfg.d = %q", seen["etc/cloud/cloud.cfg.d/90_abox.cfg"])
	}
	if !slices.Contains(stages, "debootstrap") || stages[len(stages)-1] != "done" {
		t.Errorf("progress stages %q", stages)
	}
	entries, _ := os.ReadDir(cache)
	if len(entries) != 1 {
		t.Errorf("cache holds %d entries, want only the build", len(entries))
	}
	for _, f := range []string{"root", "disk.raw"} {
		if _, err := os.Stat(filepath.Join(bt.Dir, f)); err == nil {
			t.Errorf("build directory still holds %s", f)
		}
	}

	// Cached: no commands at all.
	n := len(run.calls)
	bt2, err := b.BuildDebian12(ctx, "http://mirror.invalid/debian", cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bt2.Cached || bt2.SHA256 != bt.SHA256 || len(run.calls) != n {
		t.Errorf("second build cached=%v sha=%s ran %q; want the cached build and no commands", bt2.Cached, bt2.SHA256, run.calls[n:])
	}
}

func TestBuildFailureLeavesNothing(t *testing.T) {
	for _, step := range []string{"unshare", "chroot", "mke2fs", "qemu-img convert"} {
		t.Run(step, func(t *testing.T) {
			cache := t.TempDir()
			run := &fakeRunner{fail: map[string]error{step: errors.New("boom")}}
			_, err := Builder{Run: run}.BuildDebian12(context.Background(), "", cache, nil)
			if err == nil || !strings.Contains(err.Error(), "boom") {
				t.Fatalf("build = %v, want the %s error", err, step)
			}
			entries, _ := os.ReadDir(cache)
			if len(entries) != 0 {
				t.Errorf("cache holds %v after a failed build, want nothing", entries)
			}
			if _, err := LookupBuilt(Debian12Recipe(), cache); !errors.Is(err, ErrNotFound) {
				t.Errorf("LookupBuilt = %v, want ErrNotFound", err)
			}
		})
	}
}

func TestNaturalLess(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"vmlinuz-6.1.0-9-amd64", "vmlinuz-6.1.0-18-amd64", true},
		{"vmlinuz-6.1.0-18-amd64", "vmlinuz-6.1.0-9-amd64", false},
		{"a", "b", true},
		{"a1", "a1", false},
		{"a", "a1", true},
	}
	for _, tt := range tests {
		if got := naturalLess(tt.a, tt.b); got != tt.want {
			t.Errorf("naturalLess(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b`); got != "/tmp/a b" {
		t.Errorf("unescapeMount = %q, want %q", got, "/tmp/a b")
	}
}
