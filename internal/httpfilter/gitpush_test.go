package httpfilter

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
)

// gitHost is a stand-in code host: git's own http-backend over a bare
// repository that takes pushes, and a work tree with one commit to push.
type gitHost struct {
	bare, work string
}

func newGitHost(t *testing.T) *gitHost {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir := t.TempDir()
	g := &gitHost{bare: filepath.Join(dir, "srv", "app.git"), work: filepath.Join(dir, "work")}
	g.git(t, "", "init", "-q", "--bare", "-b", "main", g.bare)
	g.git(t, g.bare, "config", "http.receivepack", "true")
	g.git(t, g.bare, "config", "receive.advertisePushOptions", "true")
	g.git(t, "", "init", "-q", "-b", "main", g.work)
	if err := os.WriteFile(filepath.Join(g.work, "f"), []byte("one\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(t, g.work, "add", "f")
	g.git(t, g.work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
	return g
}

func (g *gitHost) handler() http.Handler {
	return &cgi.Handler{Path: "/usr/bin/git", Args: []string{"http-backend"}, Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(g.bare), "GIT_HTTP_EXPORT_ALL=1"}}
}

func gitCommand(dir string, args ...string) *exec.Cmd {
	c := exec.Command("git", args...)
	c.Dir = dir
	c.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0")
	return c
}

func (g *gitHost) git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := gitCommand(dir, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (g *gitHost) refs(t *testing.T) string {
	return g.git(t, g.bare, "for-each-ref", "--format=%(refname)")
}

// TestGitPushHeld: a real git client pushes through the proxy, which
// intercepts TLS to a host with push rules, to git's http-backend: a push
// to the agent's branch lands; a push to main, a delete, a tag, a push
// whose one ref of three is forbidden, and a push with push options are
// refused whole, git prints why, and the repository is unchanged; each is
// logged with its refs. HTTP/1.1 and HTTP/2 alike.
func TestGitPushHeld(t *testing.T) {
	for _, version := range []string{"HTTP/1.1", "HTTP/2"} {
		t.Run(version, func(t *testing.T) {
			h := newHarness(t, hopts{allow: []string{"code.test", "code.test push refs/heads/agent/*"}})
			g := newGitHost(t)
			srv := newHTTPSOrigin(t, g.handler())
			pt := port(t, srv)
			h.allowOrigin("code.test", srv, pt)
			caFile := h.caFile(t)
			url := "https://code.test:" + pt + "/app.git"
			push := func(args ...string) (string, error) {
				cmd := gitCommand(g.work, append([]string{"-c", "http.proxy=http://" + h.addr, "-c", "http.version=" + version, "push", url}, args...)...)
				cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+caFile)
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			if out, err := push("main:refs/heads/agent/x"); err != nil {
				t.Fatalf("push to agent/x: %v\n%s", err, out)
			}
			if got := g.refs(t); got != "refs/heads/agent/x\n" {
				t.Fatalf("after the push to agent/x the repository holds %q", got)
			}
			line := h.waitLine(t, "detail", "push refs/heads/agent/x create")
			if line["verdict"] != "allow" || line["rule_set"] != "code.test" {
				t.Errorf("the allowed push's line: %v", line)
			}
			cases := []struct {
				name   string
				args   []string
				want   []string
				detail string
			}{
				{"main", []string{"main"}, []string{
					"remote: abox proxy: push to code.test refused whole by the push rules of code.test",
					"remote:   create refs/heads/main: push_ref_not_allowed",
					"remote: allowed: push refs/heads/agent/*",
					"! [remote rejected] main -> main (push_ref_not_allowed, abox denial id ",
				}, "push refs/heads/main push_ref_not_allowed"},
				{"delete", []string{":refs/heads/agent/x"}, []string{"! [remote rejected] agent/x (push_delete_not_allowed"}, "push refs/heads/agent/x push_delete_not_allowed"},
				{"tag", []string{"main:refs/tags/v1"}, []string{"! [remote rejected] main -> v1 (push_ref_not_allowed"}, "push refs/tags/v1 push_ref_not_allowed"},
				{"one of three", []string{"main:refs/heads/agent/y", "main:refs/heads/main", "main:refs/heads/agent/z"}, []string{
					"! [remote rejected] main -> agent/y (push_refused_whole",
					"! [remote rejected] main -> main (push_ref_not_allowed",
					"! [remote rejected] main -> agent/z (push_refused_whole",
				}, "push refs/heads/agent/y push_refused_whole, refs/heads/main push_ref_not_allowed, refs/heads/agent/z push_refused_whole"},
				{"push option", []string{"-o", "merge_request.create", "main:refs/heads/agent/w"}, []string{"remote: abox proxy: push to code.test refused: git push request cannot be judged: push options"}, ""},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					out, err := push(c.args...)
					if err == nil {
						t.Fatalf("push %v succeeded:\n%s", c.args, out)
					}
					for _, w := range c.want {
						if !strings.Contains(out, w) {
							t.Errorf("git printed:\n%s\nwant it to hold %q", out, w)
						}
					}
					if c.detail != "" {
						line := h.waitLine(t, "detail", c.detail)
						if line["verdict"] != "block" || line["denial_id"] == nil || !strings.Contains(out, line["denial_id"].(string)) {
							t.Errorf("refusal line %v: want a block whose denial id git printed", line)
						}
					}
				})
			}
			if got := g.refs(t); got != "refs/heads/agent/x\n" {
				t.Errorf("after the refused pushes the repository holds %q, want agent/x alone", got)
			}
		})
	}
}

// TestPushRulesOnTunnelRefused: a host whose pushes are held cannot be
// tunnelled unread, with --no-mitm or as an exception.
func TestPushRulesOnTunnelRefused(t *testing.T) {
	l, err := allowlist.Parse(strings.NewReader("code.test\ncode.test push refs/heads/agent/*\nother.test\n"), "allowlist")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		noMITM     bool
		exceptions []string
		refused    bool
	}{
		{"no-mitm", true, nil, true},
		{"exception", false, []string{"code.test"}, true},
		{"exception elsewhere", false, []string{"other.test"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tun, err := NewTunnelled(c.noMITM, c.exceptions)
			if err != nil {
				t.Fatal(err)
			}
			err = tun.Check(l)
			if (err != nil) != c.refused || err != nil && !errors.Is(err, ErrRulesOnTunnel) {
				t.Errorf("Check: %v, want refused %v", err, c.refused)
			}
		})
	}
}

// TestGitPushPassive: in passive mode a push the rules refuse lands, and
// its line says would_deny.
func TestGitPushPassive(t *testing.T) {
	h := newHarness(t, hopts{passive: true, allow: []string{"code.test", "code.test push refs/heads/agent/*"}})
	g := newGitHost(t)
	srv := newHTTPSOrigin(t, g.handler())
	pt := port(t, srv)
	h.allowOrigin("code.test", srv, pt)
	caFile := h.caFile(t)
	cmd := gitCommand(g.work, "-c", "http.proxy=http://"+h.addr, "push", "https://code.test:"+pt+"/app.git", "main")
	cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+caFile)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("push to main in passive mode: %v\n%s", err, out)
	}
	if got := g.refs(t); got != "refs/heads/main\n" {
		t.Errorf("the repository holds %q, want main", got)
	}
	line := h.waitLine(t, "detail", "push refs/heads/main push_ref_not_allowed")
	if line["verdict"] != "allow" || line["would_deny"] != "push_ref_not_allowed" {
		t.Errorf("passive push line %v: want allowed, would_deny push_ref_not_allowed", line)
	}
}

// TestGitPushLarge: a push larger than git's post buffer goes chunked,
// after a probe (a flush alone); it lands on the agent's branch, and to
// main is refused with the reason printed, not a broken pipe, its pack
// read and dropped.
func TestGitPushLarge(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"code.test", "code.test push refs/heads/agent/*"}})
	g := newGitHost(t)
	big := make([]byte, 3<<20)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(g.work, "big"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(t, g.work, "add", "big")
	g.git(t, g.work, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "big")
	srv := newHTTPSOrigin(t, g.handler())
	pt := port(t, srv)
	h.allowOrigin("code.test", srv, pt)
	caFile := h.caFile(t)
	push := func(ref string) (string, error) {
		cmd := gitCommand(g.work, "-c", "http.proxy=http://"+h.addr, "-c", "http.version=HTTP/1.1", "push", "https://code.test:"+pt+"/app.git", ref)
		cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+caFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := push("main")
	if err == nil || !strings.Contains(out, "! [remote rejected] main -> main (push_ref_not_allowed") {
		t.Errorf("large push to main: %v\n%s\nwant it rejected with the reason", err, out)
	}
	if out, err := push("main:refs/heads/agent/big"); err != nil {
		t.Fatalf("large push to agent/big: %v\n%s", err, out)
	}
	if got := g.refs(t); got != "refs/heads/agent/big\n" {
		t.Errorf("the repository holds %q, want agent/big alone", got)
	}
}

// TestGitPushAnyMethodHeld: a push is held whatever the method is spelled
// as ("post", PUT): an origin may route them to receive-pack as it does
// POST. Only GET and HEAD (discovery) go on unread.
func TestGitPushAnyMethodHeld(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"code.test", "code.test push refs/heads/agent/*"}})
	g := newGitHost(t)
	srv := newHTTPSOrigin(t, g.handler())
	pt := port(t, srv)
	h.allowOrigin("code.test", srv, pt)
	line := strings.Repeat("0", 40) + " " + strings.Repeat("a", 40) + " refs/heads/main\x00 report-status\n"
	body := fmt.Sprintf("%04x", len(line)+4) + line + "0000"
	for _, m := range []string{"post", "PUT", "Post"} {
		req, err := http.NewRequest(m, "https://code.test:"+pt+"/app.git/git-receive-pack", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
		resp, err := h.client(false).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Header.Get("X-Abox-Reason") == "" {
			t.Errorf("%s of a push to main: %d without an abox refusal; want it held to the push rules", m, resp.StatusCode)
		}
	}
}

// caFile writes the proxy's CA certificate to a file for git's
// GIT_SSL_CAINFO.
func (h *harness) caFile(t *testing.T) string {
	t.Helper()
	pem, err := h.p.cfg.CA.CertPEM()
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(f, pem, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}
