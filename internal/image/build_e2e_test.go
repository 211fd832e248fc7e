//go:build e2e

package image

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestBuildDebian12 really builds (or finds cached) the Debian 12 base in
// DefaultCacheDir or $ABOX_IMAGE_CACHE. Needs root, debootstrap and a mirror
// ($ABOX_DEBIAN_MIRROR, default deb.debian.org). Run:
//
//	go test -tags e2e -run TestBuildDebian12 -v -timeout 30m ./internal/image/
func TestBuildDebian12(t *testing.T) {
	need.Root(t, "debootstrap and mke2fs -d")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	cache := os.Getenv("ABOX_IMAGE_CACHE")
	b := Builder{Run: ExecRunner{}}
	start := time.Now()
	bt, err := b.BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), cache, func(stage string, done, total int64) {
		t.Logf("%6.1fs %s", time.Since(start).Seconds(), stage)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built in %s (cached=%v): %s", time.Since(start).Round(time.Millisecond), bt.Cached, bt.Dir)
	for _, p := range []string{bt.Disk, bt.Kernel, bt.Initrd} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d MiB", p, fi.Size()>>20)
	}
	format, vsize, err := Inspect(ctx, ExecRunner{}, bt.Disk)
	if err != nil {
		t.Fatal(err)
	}
	if format != "qcow2" {
		t.Errorf("format = %s, want qcow2", format)
	}
	t.Logf("virtual size %d MiB", vsize>>20)

	// A second call must find the cache and take next to no time.
	start2 := time.Now()
	bt2, err := b.BuildDebian12(ctx, "", cache, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bt2.Cached || bt2.SHA256 != bt.SHA256 {
		t.Errorf("second build: cached=%v sha=%s, want cached build %s", bt2.Cached, bt2.SHA256, bt.SHA256)
	}
	t.Logf("cached lookup took %s", time.Since(start2))
}
