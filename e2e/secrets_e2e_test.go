//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/abox-dev/abox/e2e/lab"
	"github.com/abox-dev/abox/internal/paths"
)

// secretChecks is issue 19's injection on the suite's dev guest: a token
// stored on the host and bound to the lab's stand-in API (lab.APIHost,
// which answers 401 to anything but the real token) reaches it from a
// guest that holds only the placeholder; the value is nowhere in the
// guest's files or process environments; the same placeholder sent to
// allowed.test is refused with secret_leak. Everything is undone
// afterwards (binding, secret, allowlist entry, the guest's profile file).
func (s *suite) secretChecks(t *testing.T, proxy string) {
	t.Run("an injected secret reaches its API and nothing else; the guest never holds it", func(t *testing.T) {
		raw := make([]byte, 16)
		rand.Read(raw)
		value := "labtok-" + hex.EncodeToString(raw)
		if err := os.WriteFile(s.lab.TokenFile, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		valueFile := filepath.Join(s.tmp, "api-token")
		if err := os.WriteFile(valueFile, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		const name = "LAB_API_TOKEN"
		t.Cleanup(func() {
			s.guest("dev", "sudo rm -f /etc/profile.d/abox-secrets.sh; pkill -f 'sleep 1191' || true")
			s.abox("secret", "unbind", name, "-i", "dev", "--host", lab.APIHost)
			s.abox("secret", "rm", name)
			s.abox("allowlist", "remove", "dev", lab.APIHost)
			os.Remove(s.lab.TokenFile)
		})
		c := "curl -sS -m 20 --noproxy '' -x " + proxy + " "
		s.mustAbox("allowlist", "add", "dev", lab.APIHost)
		// Without the secret the API refuses: it is the token that opens it.
		if out, _ := s.guest("dev", c+"-o /dev/null -w '%{http_code}' https://"+lab.APIHost+"/v1/models"); strings.TrimSpace(out) != "401" {
			t.Fatalf("the API without a token answered %q, want 401", out)
		}

		s.mustAbox("secret", "set", name, "--from-file", valueFile)
		s.mustAbox("secret", "bind", name, "-i", "dev", "--host", lab.APIHost, "--bearer")
		env := s.mustAbox("secret", "env", "-i", "dev")
		ph := regexp.MustCompile(`abox-ph-[0-9a-f]{32}`).FindString(env)
		if ph == "" || strings.Contains(env, value) {
			t.Fatalf("abox secret env = %q: want a placeholder and no value", env)
		}
		// The running guest gets the placeholder as its documentation says
		// (abox secret env piped into the guest's profile).
		s.mustGuest(t, "dev", "echo "+base64.StdEncoding.EncodeToString([]byte(env))+" | base64 -d | sudo tee /etc/profile.d/abox-secrets.sh >/dev/null")
		// A process that keeps the placeholder in its environment, for the
		// /proc/*/environ search below to find it there.
		s.mustGuest(t, "dev", ". /etc/profile.d/abox-secrets.sh; nohup sleep 1191 >/dev/null 2>&1 &")

		out := s.mustGuest(t, "dev", ". /etc/profile.d/abox-secrets.sh; "+c+"-i -H \"Authorization: Bearer $"+name+"\" https://"+lab.APIHost+"/v1/models")
		if !strings.Contains(out, " 200") || !strings.Contains(out, "GET /v1/models host="+lab.APIHost) {
			t.Errorf("the API with the placeholder: %q, want 200 from the origin", out)
		}
		out, _ = s.guest("dev", ". /etc/profile.d/abox-secrets.sh; "+c+"-i -H \"Authorization: Bearer $"+name+"\" https://allowed.test/")
		low := strings.ToLower(out)
		if !strings.Contains(out, " 403") || !strings.Contains(low, "x-abox-reason: secret_leak") || !strings.Contains(out, "secret "+name) {
			t.Errorf("the placeholder to allowed.test: %q, want 403 secret_leak naming %s", out, name)
		}
		if strings.Contains(out, value) {
			t.Errorf("the refusal holds the value")
		}

		// The value is nowhere in the guest. The pattern is decoded inside
		// a root shell, so that it is in no command line sudo or a log
		// could keep; only grep's own argv (in /proc, not searched) has it.
		b64 := base64.StdEncoding.EncodeToString([]byte(value))
		phb64 := base64.StdEncoding.EncodeToString([]byte(ph))
		search := "p=$(echo " + b64 + " | base64 -d); q=$(echo " + phb64 + " | base64 -d); " +
			"echo files=$(timeout 500 grep -rIlsF -D skip --exclude-dir=proc --exclude-dir=sys -e \"$p\" / | wc -l); " +
			"v=0; h=0; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f 2>/dev/null | grep -qF -e \"$p\" && v=$((v+1)); tr '\\0' '\\n' < $f 2>/dev/null | grep -qF -e \"$q\" && h=$((h+1)); done; " +
			"echo environ=$v placeholder=$h"
		out = s.mustGuest(t, "dev", "sudo sh -c '"+strings.ReplaceAll(search, "'", `'\''`)+"'")
		t.Logf("guest search for the value: %s", strings.TrimSpace(out))
		if !strings.Contains(out, "files=0") || !strings.Contains(out, "environ=0") {
			t.Errorf("the value is in the guest: %q", out)
		}
		// The search would have seen it: the placeholder is in an environ.
		if strings.Contains(out, "placeholder=0") || !strings.Contains(out, "placeholder=") {
			t.Errorf("the environ search found no placeholder either (%q): it proves nothing", out)
		}

		// Nothing the daemon wrote holds the value; the decision log
		// names the secret, on the injection and on the refusal.
		files := (paths.Layout{Root: s.home}).Instance("dev")
		for _, f := range []string{files.HTTPLog, files.DaemonLog, files.KeyLog} {
			if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), value) {
				t.Errorf("%s holds the value", f)
			}
		}
		if b, err := os.ReadFile(files.HTTPLog); err != nil || !strings.Contains(string(b), `"injected":"`+name+`"`) || !strings.Contains(string(b), `"secret":"secret_leak: secret `+name) {
			t.Errorf("%s: %v; want a line injecting %s and one refusing it with secret_leak", files.HTTPLog, err, name)
		}
	})
}
