//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/image"
	"github.com/abox-dev/abox/internal/paths"
)

// labSuite is the start of a VM test: the base image built (cached), a lab
// named labName started, `abox base build` run in it, and a cleanup that
// removes the named instances (with the end of their logs when the test
// failed) and tears the lab down. ctx bounds the whole test.
func labSuite(t *testing.T, ctx context.Context, labName string, instances ...string) *suite {
	t.Helper()
	s := &suite{t: t, ctx: ctx, tmp: t.TempDir()}
	os.Chmod(s.tmp, 0o755)
	if _, err := (image.Builder{Run: image.ExecRunner{}}).BuildDebian12(ctx, os.Getenv("ABOX_DEBIAN_MIRROR"), os.Getenv("ABOX_IMAGE_CACHE"), nil); err != nil {
		t.Fatalf("building the base image: %v", err)
	}
	l, err := lab.Start(ctx, "..", labName, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	s.lab, s.env, s.home = l, l.Env, l.Home
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer ccancel()
		s.ctx = cctx
		for _, name := range instances {
			if t.Failed() {
				f := paths.Layout{Root: s.home}.Instance(name)
				for _, log := range []string{f.DaemonLog, f.MonitorDaemon, f.MonitorAgentLog, f.SerialLog} {
					if b, err := os.ReadFile(log); err == nil {
						t.Logf("%s %s:\n%s", name, filepath.Base(log), tail(string(b), 30))
					}
				}
			}
			if out, err := s.abox("remove", "--force", name); err != nil && !strings.Contains(out, "no such instance") {
				t.Logf("remove %s: %v\n%s", name, err, out)
			}
		}
		if err := l.Close(cctx); err != nil {
			t.Errorf("teardown: %v", err)
		}
	})
	s.mustAbox("base", "build", "debian-12")
	return s
}
