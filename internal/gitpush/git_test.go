package gitpush

import (
	"bytes"
	"io"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepos makes a bare repository that takes pushes over http-backend,
// served at srv/app.git, and a clone-to-be work tree with one commit.
func gitRepos(t *testing.T) (root, work string) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	root, work = filepath.Join(dir, "srv"), filepath.Join(dir, "work")
	run(t, "", "git", "init", "-q", "--bare", "-b", "main", filepath.Join(root, "app.git"))
	run(t, filepath.Join(root, "app.git"), "git", "config", "http.receivepack", "true")
	// The server takes push options, so that git sends them and only the
	// holder refuses them.
	run(t, filepath.Join(root, "app.git"), "git", "config", "receive.advertisePushOptions", "true")
	run(t, "", "git", "init", "-q", "-b", "main", work)
	if err := os.WriteFile(filepath.Join(work, "f"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run(t, work, "git", "add", "f")
	run(t, work, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
	return root, work
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := gitCmd(dir, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func gitCmd(dir string, args ...string) *exec.Cmd {
	c := exec.Command(args[0], args[1:]...)
	c.Dir = dir
	c.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "HOME="+os.TempDir(), "GIT_TERMINAL_PROMPT=0")
	return c
}

func backend(root string) http.Handler {
	return &cgi.Handler{Path: "/usr/bin/git", Args: []string{"http-backend"}, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
}

// holdingServer answers as the proxy does: discovery by the real backend,
// a push decided by set, then replayed to the backend or refused.
func holdingServer(t *testing.T, root string, set *Set) *httptest.Server {
	be := backend(root)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/git-receive-pack") {
			be.ServeHTTP(w, r)
			return
		}
		req, raw, err := Read(r.Body)
		var d Decision
		msg := "abox: push refused"
		if err == nil {
			d = set.Check(req)
			if d.Allowed {
				r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(raw), r.Body))
				be.ServeHTTP(w, r)
				return
			}
			msg = "abox: push refused: " + d.Reason + " by the push rules of " + set.Name()
		} else {
			msg = "abox: " + err.Error()
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ContentType)
		w.Write(Refusal(req, d, msg, func(v Verdict) string { return v.Reason }))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRealGitPush(t *testing.T) {
	root, work := gitRepos(t)
	set := NewSet("code.test", []Rule{mustRule(t, "refs/heads/agent/*")})
	srv := holdingServer(t, root, set)
	url := srv.URL + "/app.git"
	bare := filepath.Join(root, "app.git")
	push := func(args ...string) (string, error) {
		out, err := gitCmd(work, append([]string{"git", "push", url}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := push("main:refs/heads/agent/x")
	if err != nil {
		t.Fatalf("push to agent/x: %v\n%s", err, out)
	}
	head := strings.TrimSpace(run(t, work, "git", "rev-parse", "HEAD"))
	if got := strings.TrimSpace(run(t, bare, "git", "rev-parse", "refs/heads/agent/x")); got != head {
		t.Fatalf("agent/x is %s, want %s", got, head)
	}
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{"main", []string{"main"}, []string{"remote: abox: push refused: push_ref_not_allowed", "! [remote rejected] main -> main (push_ref_not_allowed)"}},
		{"delete", []string{":refs/heads/agent/x"}, []string{"[remote rejected] agent/x (push_delete_not_allowed)"}},
		{"tag", []string{"main:refs/tags/v1"}, []string{"[remote rejected] main -> v1 (push_ref_not_allowed)"}},
		{"many, one forbidden", []string{"main:refs/heads/agent/y", "main:refs/heads/agent/z", "main:refs/heads/main"}, []string{"main -> agent/y (push_refused_whole)", "main -> main (push_ref_not_allowed)"}},
		{"push option", []string{"-o", "ci.skip", "main:refs/heads/agent/w"}, []string{"remote: abox: git push request cannot be judged: push options"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := push(c.args...)
			t.Logf("git push %s:\n%s", strings.Join(c.args, " "), out)
			if err == nil {
				t.Fatalf("push %v succeeded:\n%s", c.args, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("git printed:\n%s\nwant it to hold %q", out, w)
				}
			}
		})
	}
	refs := run(t, bare, "git", "for-each-ref", "--format=%(refname)")
	if refs != "refs/heads/agent/x\n" {
		t.Errorf("the bare repository holds %q, want agent/x alone", refs)
	}
}

func mustRule(t *testing.T, s string) Rule {
	t.Helper()
	r, err := ParseRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
