//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/paths"
)

// gitPushChecks is issue 19's push rule on the suite's dev guest: with the
// lab's code host listed and its pushes held to refs/heads/agent/*, a push
// from the guest to agent/x lands in the bare repository, and a push to
// main is refused, git printing the reason, main unchanged. The allowlist
// is put back afterwards.
func (s *suite) gitPushChecks(t *testing.T, proxy string) {
	t.Run("git pushes held to the agent's branches", func(t *testing.T) {
		file := (paths.Layout{Root: s.home}).Allowlist("dev")
		orig, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := os.WriteFile(file, orig, 0o644); err != nil {
				t.Errorf("restoring the allowlist: %v", err)
			}
			if out, err := s.abox("allowlist", "reload", "dev"); err != nil {
				t.Errorf("reloading the restored allowlist: %v\n%s", err, out)
			}
		})
		s.mustAbox("allowlist", "add", "dev", lab.CodeHost, lab.CodeHost+" push refs/heads/agent/*")
		bare := filepath.Join(s.lab.GitRoot, lab.CodeRepo)
		rev := func(ref string) string {
			out, err := run(s.ctx, "git", "-C", bare, "rev-parse", "--verify", "-q", ref)
			if err != nil {
				return ""
			}
			return strings.TrimSpace(out)
		}
		mainBefore := rev("refs/heads/main")
		git := "git -c http.proxy=" + proxy + " -c user.name=t -c user.email=t@t.test "
		s.mustGuest(t, "dev", "rm -rf /tmp/push-clone && "+git+"clone -q https://"+lab.CodeHost+"/"+lab.CodeRepo+" /tmp/push-clone && cd /tmp/push-clone && "+git+"commit -q --allow-empty -m 'the agent'")
		head := strings.TrimSpace(s.mustGuest(t, "dev", "git -C /tmp/push-clone rev-parse HEAD"))

		if out, err := s.guest("dev", "cd /tmp/push-clone && "+git+"push origin HEAD:refs/heads/agent/x 2>&1"); err != nil {
			t.Fatalf("push to agent/x: %v\n%s", err, out)
		}
		if got := rev("refs/heads/agent/x"); got != head {
			t.Errorf("the code host's agent/x = %q, want the guest's %s", got, head)
		}

		out, err := s.guest("dev", "cd /tmp/push-clone && "+git+"push origin HEAD:main 2>&1")
		if err == nil {
			t.Errorf("push to main succeeded:\n%s", out)
		}
		for _, want := range []string{
			"remote: abox proxy: push to " + lab.CodeHost + " refused whole by the push rules of " + lab.CodeHost,
			"! [remote rejected] HEAD -> main (push_ref_not_allowed, abox denial id ",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("git printed:\n%s\nwant it to hold %q", out, want)
			}
		}
		if got := rev("refs/heads/main"); got != mainBefore {
			t.Errorf("the code host's main moved from %s to %s: the push got through", mainBefore, got)
		}
	})
}
