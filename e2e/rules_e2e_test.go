//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/paths"
)

// readOnlyCodeHost: with request rules that let the guest read the lab's
// code host (git's smart HTTP, served by git http-backend, which takes
// pushes) but not write to it, the guest clones and fetches with git,
// and its push and API writes are refused by the proxy with the rule
// set's reason before the code host sees them.
func (s *suite) readOnlyCodeHost(t *testing.T, name, proxy string) {
	rules := []string{
		lab.CodeHost + " GET /*/info/refs?service=git-upload-pack",
		lab.CodeHost + " POST /*/git-upload-pack",
	}
	s.mustAbox(append([]string{"allowlist", "add", name}, rules...)...)
	defer s.mustAbox("allowlist", "remove", name, lab.CodeHost)

	repo := "https://" + lab.CodeHost + "/" + lab.CodeRepo
	git := "git -c http.proxy=" + proxy + " -c user.name=agent -c user.email=agent@example.com"
	s.mustGuest(t, name, "rm -rf /tmp/app && "+git+" clone -q "+repo+" /tmp/app")
	if out := s.mustGuest(t, name, "git -C /tmp/app log --format=%s"); !strings.Contains(out, "the lab's first commit") {
		t.Fatalf("the clone's log = %q, want the code host's commit", out)
	}
	s.mustGuest(t, name, "cd /tmp/app && "+git+" fetch -q origin")

	out, err := s.guest(name, "cd /tmp/app && "+git+" commit -q --allow-empty -m 'from the agent' && "+git+" push origin HEAD:main 2>&1")
	if err == nil || !strings.Contains(out, "403") {
		t.Errorf("git push through read-only rules: err %v, output %q; want it refused with 403", err, out)
	}
	if log := bareLog(t, s.lab.GitRoot); strings.Contains(log, "from the agent") {
		t.Errorf("the push reached the code host: %q", log)
	}

	// An API write and a method the rules do not name, on paths a rule
	// does and does not cover; the 403 names the reason and the rule set.
	for _, tc := range []struct{ method, path, reason string }{
		{"POST", "/api/repos/acme/app/issues", "path_not_allowed"},
		{"POST", "/" + lab.CodeRepo + "/git-receive-pack", "path_not_allowed"},
		{"DELETE", "/" + lab.CodeRepo + "/git-upload-pack", "method_not_allowed"},
		// An escape of the allowed path reaches no other path.
		{"POST", "/" + lab.CodeRepo + "/git-upload-pack/..%2fgit-receive-pack", ""},
		{"POST", "/" + lab.CodeRepo + "/%2e%2e/" + lab.CodeRepo + "/git-receive-pack", ""},
	} {
		body, _ := s.guest(name, "curl -sS -m 20 --noproxy '' --path-as-is -x "+proxy+" -X "+tc.method+" -w ' %{http_code}' -d x "+repo[:len(repo)-len(lab.CodeRepo)-1]+tc.path)
		if !strings.HasSuffix(strings.TrimSpace(body), "403") && !strings.HasSuffix(strings.TrimSpace(body), "400") {
			t.Errorf("%s %s = %q, want it refused", tc.method, tc.path, body)
			continue
		}
		if tc.reason != "" && (!strings.Contains(body, tc.reason) || !strings.Contains(body, lab.CodeHost)) {
			t.Errorf("%s %s: 403 body %q, want the reason %s and the rule set %s", tc.method, tc.path, body, tc.reason, lab.CodeHost)
		}
	}
	if log := bareLog(t, s.lab.GitRoot); strings.Contains(log, "from the agent") {
		t.Errorf("a write reached the code host: %q", log)
	}

	// The decision log names the refusals of the push.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(paths.Layout{Root: s.home}.Instance(name).HTTPLog)
		if strings.Contains(string(b), "git-receive-pack") && strings.Contains(string(b), "path_not_allowed") {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("http.log has no path_not_allowed line for git-receive-pack:\n%s", tail(string(b), 10))
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// bareLog is the commit subjects of the lab's code host repository.
func bareLog(t *testing.T, root string) string {
	t.Helper()
	out, err := exec.Command("git", "-C", filepath.Join(root, lab.CodeRepo), "log", "--format=%s", "main").CombinedOutput()
	if err != nil {
		t.Fatalf("reading the code host's log: %v: %s", err, out)
	}
	return string(out)
}
