//go:build e2e

package e2e

import (
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/e2e/lab"
)

// learnChecks is issue 18's learn-then-propose path on the suite's dev
// guest: a small script (a git clone and fetch from the lab's code host,
// reads and one write against blocked.test; dev lists neither) runs in
// learn mode, where the refusals of active mode other than the list stay;
// propose --apply then makes an allowlist under which the same script
// runs in active mode, and a new write (a push, a POST elsewhere) is
// refused. The allowlist is put back afterwards, as the
// suite's later subtests expect blocked.test refused.
func (s *suite) learnChecks(t *testing.T, proxy string) {
	t.Run("learn then propose: the script runs again, a new write is refused", func(t *testing.T) {
		s.restoreAllowlist(t, "dev")
		t.Cleanup(func() {
			// Before the allowlist is put back: active again, the record
			// cleared.
			s.abox("net", "filter", "dev", "active")
			s.abox("net", "learn", "clear", "dev")
		})
		c := "curl -sS -m 20 --noproxy '' -x " + proxy + " -o /dev/null -w '%{http_code}\\n' "
		git := "git -c http.proxy=" + proxy + " "
		repo := "https://" + lab.CodeHost + "/" + lab.CodeRepo
		script := strings.Join([]string{
			"rm -rf /tmp/learn-clone",
			git + "clone -q " + repo + " /tmp/learn-clone && echo 200",
			git + "-C /tmp/learn-clone fetch -q origin && echo 200",
			c + "'https://blocked.test/repo/acme/app/info/refs?service=git-upload-pack'",
			c + "https://blocked.test/repo/acme/app/objects/1",
			c + "https://blocked.test/repo/acme/app/objects/2",
			c + "https://blocked.test/repo/acme/app/objects/3",
			c + "-X POST -d x=1 https://blocked.test/api/items",
			c + "http://blocked.test/plain/readme",
		}, "\n") + "\n"
		s.mustGuest(t, "dev", "echo "+base64.StdEncoding.EncodeToString([]byte(script))+" | base64 -d > /tmp/learn.sh")
		runScript := func(when string) {
			t.Helper()
			out := s.mustGuest(t, "dev", "sh /tmp/learn.sh")
			if got := strings.Fields(out); len(got) != 8 || strings.Count(out, "200") != 8 {
				t.Fatalf("%s: the script's statuses = %q, want eight 200s", when, got)
			}
		}
		// Before: dev does not list blocked.test.
		if out, _ := s.guest("dev", c+"https://blocked.test/repo/acme/app/objects/1"); strings.TrimSpace(out) == "200" {
			t.Fatalf("blocked.test reachable before learning: %q", out)
		}

		s.mustAbox("net", "learn", "start", "dev", "--reset")
		runScript("learning")
		// Learn mode keeps every refusal but the list's.
		for _, r := range []struct{ url, reason string }{
			{"http://" + originIP + "/literal", "not_allowlisted"},
			{"http://private.test/", "forbidden_address"},
			{"http://loop.test/", "forbidden_address"},
			{"http://169.254.169.254/latest/meta-data/", "metadata"},
			{"http://printer.local/", "special_use_name"},
		} {
			out, _ := s.guest("dev", "curl -sS -m 15 --noproxy '' -i -x "+proxy+" '"+r.url+"' || true")
			if !strings.Contains(out, " 403 ") || !strings.Contains(strings.ToLower(out), "x-abox-reason: "+r.reason) {
				t.Errorf("learning: %s = %s, want 403 %s", r.url, out, r.reason)
			}
		}
		rec := s.mustAbox("net", "learn", "show", "dev", "--json")
		if !strings.Contains(rec, "/repo/acme/app/objects/1") || strings.Contains(rec, "service=") || strings.Contains(rec, originIP) {
			t.Errorf("learn show: want the paths, never the query or a literal:\n%s", rec)
		}

		out := s.mustAbox("net", "propose", "dev", "--json")
		var res struct {
			Lines []struct {
				Line   string   `json:"line"`
				Review []string `json:"review"`
			} `json:"lines"`
		}
		if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil {
			t.Fatalf("propose --json: %v\n%s", err, out)
		}
		got := map[string]string{}
		for _, l := range res.Lines {
			// Only the script's hosts: the guest's own background traffic
			// (if any) is proposed too, and is not this test's.
			if strings.HasPrefix(l.Line, "blocked.test ") || strings.HasPrefix(l.Line, lab.CodeHost+" ") {
				got[l.Line] = strings.Join(l.Review, "; ")
			}
		}
		for _, want := range []string{
			"blocked.test GET /plain/readme",
			"blocked.test GET /repo/acme/app/info/refs",
			"blocked.test GET /repo/acme/app/objects/*",
			"blocked.test POST /api/items",
			lab.CodeHost + " GET /" + lab.CodeRepo + "/info/refs",
			lab.CodeHost + " POST /" + lab.CodeRepo + "/git-upload-pack",
		} {
			if _, ok := got[want]; !ok {
				t.Errorf("proposal lacks %q: %q", want, got)
			}
		}
		if len(got) != 6 || !strings.Contains(got["blocked.test POST /api/items"], "carry data out") {
			t.Errorf("proposal = %q, want the six lines above, the POSTs flagged for review", got)
		}

		s.mustAbox("net", "propose", "dev", "--apply")
		s.mustAbox("net", "learn", "stop", "dev")
		if m := strings.TrimSpace(s.mustAbox("net", "filter", "dev")); m != "active" {
			t.Fatalf("mode after learn stop = %q", m)
		}
		runScript("after propose --apply, in active mode")
		// Writes the script never made: refused by the rules (the proxy's
		// enforcement of request rules, issue 18). A push discovers with
		// a GET of info/refs, which the proposal allows (it has no query
		// constraint), then sends POST git-receive-pack, which it does not.
		push := "cd /tmp/learn-clone && git -c user.name=t -c user.email=t@t.test commit -q --allow-empty -m learned && " + git + "push -q origin HEAD:main 2>&1"
		if out, err := s.guest("dev", push); err == nil || !strings.Contains(out, "403") {
			t.Errorf("push after apply: %v\n%s\nwant it refused with a 403", err, out)
		}
		if out, err := run(s.ctx, "git", "-C", filepath.Join(s.lab.GitRoot, lab.CodeRepo), "rev-list", "--count", "main"); err != nil || strings.TrimSpace(out) != "1" {
			t.Errorf("the code host's main has %q commits (%v), want 1: the push got through", strings.TrimSpace(out), err)
		}
		for _, w := range []struct{ args, reasons string }{
			{"-X POST -d x=1 https://blocked.test/api/other", "path_not_allowed"},
			{"-X DELETE https://blocked.test/api/items", "method_not_allowed"},
			{"-X PUT -d x=1 https://blocked.test/repo/acme/app/objects/1", "method_not_allowed"},
		} {
			out, _ := s.guest("dev", "curl -sS -m 15 --noproxy '' -i -x "+proxy+" "+w.args+" || true")
			if !strings.Contains(out, " 403 ") || !strings.Contains(strings.ToLower(out), "x-abox-reason: "+w.reasons) || strings.Contains(out, "hello from testorigin") {
				t.Errorf("after apply: curl %s = %s, want 403 %s", w.args, out, w.reasons)
			}
		}
	})
}
