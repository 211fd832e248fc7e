//go:build e2e

package e2e

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

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

// fileSecretName is the secret the workflow's abox.yaml binds to the
// lab's stand-in API (workflowSecretYAML).
const fileSecretName = "WF_API_TOKEN"

// workflowSecretYAML is the workflow abox.yaml's secrets section: GET
// under /v1/ on lab.APIHost carries the token, as a bearer.
const workflowSecretYAML = "secrets:\n  - {name: " + fileSecretName + ", host: " + lab.APIHost + ", bearer: true, rules: [\"GET /v1/**\"]}\n"

// storeWorkflowSecret makes a fresh token, gives it to the stand-in API
// and stores it on the host as fileSecretName, before the first up.
func (w *wf) storeWorkflowSecret(t *testing.T) string {
	raw := make([]byte, 16)
	rand.Read(raw)
	value := "wftok-" + hex.EncodeToString(raw)
	if err := os.WriteFile(w.lab.TokenFile, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	valueFile := filepath.Join(t.TempDir(), "wf-token")
	if err := os.WriteFile(valueFile, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	w.must(t, "secret", "set", fileSecretName, "--from-file", valueFile)
	return value
}

// secretFromFileChecks: the guest `abox up` made from an abox.yaml with a
// binding has the placeholder in its environment from the first boot
// (nothing was written into it since), in SSH sessions and login shells;
// a call with it opens the stand-in API, a request outside the binding's
// rules with it is refused as a leak, and the value is in no guest
// environment.
func (w *wf) secretFromFileChecks(t *testing.T, value string) {
	env := w.must(t, "secret", "env", "-i", "wf", "--environment")
	ph := regexp.MustCompile(fileSecretName + `=(abox-ph-[0-9a-f]{32})`).FindStringSubmatch(env)
	if ph == nil || strings.Contains(env, value) {
		t.Fatalf("abox secret env -i wf = %q: want %s's placeholder and no value", env, fileSecretName)
	}
	for _, cmd := range []string{"echo \"$" + fileSecretName + "\"", "bash -lc 'echo \"$" + fileSecretName + "\"'"} {
		if got := w.guest(t, cmd); got != ph[1] {
			t.Errorf("in the guest, %s = %q; want the placeholder %s from the seed", cmd, got, ph[1])
		}
	}
	// The proxy comes from the session's environment, as for any tool;
	// code= is the origin's status (curl -i also shows the CONNECT's 200).
	c := "curl -sS -m 20 -i -w '\\ncode=%{http_code}' -H \"Authorization: Bearer $" + fileSecretName + "\" https://" + lab.APIHost
	out := w.guest(t, c+"/v1/models")
	if !strings.HasSuffix(out, "code=200") || !strings.Contains(out, "GET /v1/models host="+lab.APIHost) {
		t.Errorf("the API with the placeholder from boot: %q, want 200 from the origin", out)
	}
	out = w.guest(t, c+"/v1/models -X POST || true")
	if !strings.HasSuffix(out, "code=403") || !strings.Contains(strings.ToLower(out), "x-abox-reason: secret_leak") {
		t.Errorf("the placeholder on a POST the binding's rules leave out: %q, want 403 secret_leak", out)
	}
	b64 := base64.StdEncoding.EncodeToString([]byte(value))
	out = w.guest(t, "sudo sh -c 'p=$(echo "+b64+" | base64 -d); v=0; for f in /proc/[0-9]*/environ; do tr \"\\0\" \"\\n\" < $f 2>/dev/null | grep -qF -e \"$p\" && v=$((v+1)); done; echo environ=$v; grep -rlsF -e \"$p\" /etc /home /root /var/lib/cloud | wc -l'")
	if !strings.HasPrefix(out, "environ=0\n0") {
		t.Errorf("the value is in the guest: %q, want environ=0 and no file", out)
	}
}

// archiveHoldsNoValue: the export archive of an instance whose guest used
// a bound secret holds no value, its disk included: the decompressed
// stream is searched end to end (with an overlap, so that a value split
// across two reads is seen).
func archiveHoldsNoValue(t *testing.T, archive, value string) {
	if value == "" {
		t.Fatal("no value to search the archive for")
	}
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	v := []byte(value)
	buf := make([]byte, 0, 1<<20+len(v))
	var n int64
	for {
		keep := min(len(buf), len(v)-1)
		copy(buf, buf[len(buf)-keep:])
		m, err := io.ReadFull(zr, buf[keep:cap(buf)])
		buf = buf[:keep+m]
		n += int64(m)
		if bytes.Contains(buf, v) {
			t.Errorf("the export archive holds the secret's value (within its first %d decompressed bytes)", n)
			return
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("FIGURE searched the decompressed archive (%d MiB) for the value: %s", n>>20, time.Since(t0).Round(time.Second))
}
