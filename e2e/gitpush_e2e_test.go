//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/paths"
)

// gitPushChecks is issue 19's push rule with an injected token on the
// suite's dev guest: the lab's code host takes a push only with its token
// (Basic auth), which the guest never holds. With the host listed and its
// pushes held to refs/heads/agent/*, a push without the binding is refused
// by the code host; with the token stored on the host and bound to it, a
// push from the guest to agent/x lands in the bare repository, and a push
// to main is refused by the proxy, git printing the reason, main
// unchanged. The allowlist, the secret and its binding are put back
// afterwards.
func (s *suite) gitPushChecks(t *testing.T, proxy string) {
	t.Run("git pushes held to the agent's branches", func(t *testing.T) {
		s.restoreAllowlist(t, "dev")
		const secret = "LAB_GIT_TOKEN"
		raw := make([]byte, 16)
		rand.Read(raw)
		value := "gittok-" + hex.EncodeToString(raw)
		valueFile := filepath.Join(s.tmp, "git-token")
		for _, f := range []string{s.lab.GitTokenFile, valueFile} {
			if err := os.WriteFile(f, []byte(value+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			s.abox("secret", "unbind", secret, "-i", "dev", "--host", lab.CodeHost)
			s.abox("secret", "rm", secret)
			os.Remove(s.lab.GitTokenFile)
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

		// Without the token the code host refuses the push (the guest has
		// no credential to offer, and no prompt to ask for one).
		push := "cd /tmp/push-clone && GIT_TERMINAL_PROMPT=0 " + git + "push origin "
		if out, err := s.guest("dev", push+"HEAD:refs/heads/agent/x 2>&1"); err == nil || rev("refs/heads/agent/x") != "" {
			t.Fatalf("a push without the token landed: %v\n%s", err, out)
		}
		s.mustAbox("secret", "set", secret, "--from-file", valueFile)
		s.mustAbox("secret", "bind", secret, "-i", "dev", "--host", lab.CodeHost, "--basic", "agent")

		if out, err := s.guest("dev", push+"HEAD:refs/heads/agent/x 2>&1"); err != nil {
			t.Fatalf("push to agent/x: %v\n%s", err, out)
		}
		if got := rev("refs/heads/agent/x"); got != head {
			t.Errorf("the code host's agent/x = %q, want the guest's %s", got, head)
		}

		out, err := s.guest("dev", push+"HEAD:main 2>&1")
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

// restoreAllowlist puts instance's allowlist file back as it is now, and
// reloads it, when t ends (cleanups run last-added first: a test's own
// cleanups added later run before it).
func (s *suite) restoreAllowlist(t *testing.T, instance string) {
	t.Helper()
	file := (paths.Layout{Root: s.home}).Allowlist(instance)
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(file, orig, 0o644); err != nil {
			t.Errorf("restoring the allowlist: %v", err)
		}
		if out, err := s.abox("allowlist", "reload", instance); err != nil {
			t.Errorf("reloading the restored allowlist: %v\n%s", err, out)
		}
	})
}
