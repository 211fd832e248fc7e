package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/secrets"
)

// TestSecretsSection: each item becomes the binding abox secret bind would
// make for the file's instance, in file order, at its line.
func TestSecretsSection(t *testing.T) {
	src := `version: 1
name: dev
secrets:
  - name: OPENAI_API_KEY
    host: API.OpenAI.com
    bearer: true
    rules: ["POST /v1/**"]
  - {name: ANTHROPIC_API_KEY, host: api.anthropic.com, header: x-api-key}
  - name: GH_TOKEN
    host: github.com:8443
    basic: x-access-token
`
	c, err := parse(t, src)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name, binding string
		line          int
	}{
		{"OPENAI_API_KEY", "dev -> api.openai.com [POST /v1/**] as Authorization: Bearer", 4},
		{"ANTHROPIC_API_KEY", "dev -> api.anthropic.com as X-Api-Key", 8},
		{"GH_TOKEN", "dev -> github.com:8443 as Authorization: Basic (user x-access-token)", 9},
	}
	if len(c.Secrets) != len(want) {
		t.Fatalf("secrets = %+v, want %d", c.Secrets, len(want))
	}
	for i, w := range want {
		s := c.Secrets[i]
		if s.Name != w.name || s.Binding.String() != w.binding || s.Line != w.line || s.Key != "secrets["+string(rune('0'+i))+"]" {
			t.Errorf("secrets[%d] = %s %q line %d key %s, want %s %q line %d", i, s.Name, s.Binding, s.Line, s.Key, w.name, w.binding, w.line)
		}
	}
	if w := c.Widenings(); len(w) != 3 || w[0].Key != "secrets" || !strings.Contains(w[0].Why, "OPENAI_API_KEY -> api.openai.com [POST /v1/**]") {
		t.Errorf("widenings = %v, want one per binding naming secret, host and rules", w)
	}
}

// TestSecretsErrors: every bad item is an error at its file:line that
// says what to write instead; a value, or what looks like one, is refused
// without being repeated and points to abox secret set.
func TestSecretsErrors(t *testing.T) {
	const value = "sk-proj-Zq81VaLx0pW3mN7tYb2cRd5eFg"
	head := "version: 1\nname: dev\nsecrets:\n"
	for _, tc := range []struct{ name, src, want string }{
		{"a value key", "  - name: OPENAI_API_KEY\n    host: api.openai.com\n    bearer: true\n    value: " + value + "\n", "abox.yaml:7:5: secrets[0].value: abox.yaml names secrets, never their values"},
		{"a token key", "  - {name: A, host: a.example.com, bearer: true, token: x}\n", "secrets[0].token: abox.yaml names secrets, never their values"},
		{"a value as the host", "  - {name: A, host: " + value + ", bearer: true}\n", "secrets[0].host: this looks like a credential"},
		{"a value in a field", "  - name: A\n    host: a.example.com\n    header: " + value + "\n", "abox.yaml:6:13: secrets[0].header: this looks like a credential"},
		{"an opaque value in a field", "  - {name: A, host: a.example.com, header: Zq81VaLx0pW3mN7tYb2cRd5eFgQ}\n", "secrets[0].header: this looks like a credential"},
		{"the section as a mapping", "  OPENAI_API_KEY: " + value + "\n", "abox.yaml:4:3: secrets: want a list of bindings"},
		{"an item as a string", "  - " + value + "\n", "secrets[0]: want a mapping (name, host, rules, bearer, basic, header), got a value; abox.yaml names secrets, never their values"},
		{"basic with a password", "  - {name: A, host: a.example.com, basic: \"user:" + value + "\"}\n", "secrets[0].basic: holds ':'; basic is the user name only"},
		{"an unknown key", "  - {name: A, host: a.example.com, bearer: true, rule: [\"GET /x\"]}\n", `unknown key "secrets[0].rule" (did you mean "rules"?)`},
		{"no name", "  - {host: a.example.com, bearer: true}\n", "abox.yaml:4:5: secrets[0]: no name"},
		{"a bad name", "  - {name: 9LIVES, host: a.example.com, bearer: true}\n", "secrets[0].name: secret name \"9LIVES\": want an environment variable name"},
		{"a reserved name", "  - {name: HTTPS_PROXY, host: a.example.com, bearer: true}\n", "already uses HTTPS_PROXY"},
		{"no host", "  - {name: A, bearer: true}\n", "secrets[0]: no host"},
		{"a URL as host", "  - {name: A, host: \"https://a.example.com/v1\", bearer: true}\n", "secrets[0].host: host \"https://a.example.com/v1\": write a host name (and optionally :port) only, without scheme or path; restrict paths with rules"},
		{"no way of sending", "  - {name: A, host: a.example.com}\n", "secrets[0]: say how A is sent with exactly one of bearer: true, basic: USER or header: NAME (got 0)"},
		{"two ways of sending", "  - {name: A, host: a.example.com, bearer: true, header: x-api-key}\n", "(got 2)"},
		{"a bad rule", "  - {name: A, host: a.example.com, bearer: true, rules: [\"FETCH /x\"]}\n", "abox.yaml:4:58: secrets[0].rules[0]: rule \"FETCH /x\""},
		{"an audit rule", "  - {name: A, host: a.example.com, bearer: true, rules: [\"GET /x audit\"]}\n", "drop the word audit"},
		{"empty rules", "  - {name: A, host: a.example.com, bearer: true, rules: []}\n", "secrets[0].rules: no rules"},
		{"a framing header", "  - {name: A, host: a.example.com, header: Host}\n", "secrets[0].header: header \"Host\": a secret cannot be sent in a header that frames the request"},
		{"bound twice", "  - {name: A, host: a.example.com, bearer: true}\n  - {name: A, host: A.example.com, header: x-key}\n", "abox.yaml:5:5: secrets[1]: A is bound to a.example.com at secrets[0] (line 4) already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, head+tc.src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v\nwant it to contain %q", err, tc.want)
			}
			if strings.Contains(err.Error(), value) || strings.Contains(err.Error(), "Zq81VaLx0pW3") {
				t.Errorf("the error repeats the value: %v", err)
			}
			if strings.Contains(tc.name, "value") && !strings.Contains(err.Error(), "abox secret set") {
				t.Errorf("the error does not say to use abox secret set: %v", err)
			}
		})
	}
}

// TestSecretsReach: a binding no request could use is refused at load
// with its line: a host the merged allowlist (the file's included) does
// not allow, a port the proxy does not open, a host tunnelled unseen.
func TestSecretsReach(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"allowed inline", "allowlist: [api.example.com]\nsecrets:\n  - {name: A, host: api.example.com, bearer: true}\n", ""},
		{"allowed by a wildcard", "allowlist: [\"*.example.com\"]\nsecrets:\n  - {name: A, host: api.example.com, bearer: true}\n", ""},
		{"allowed by the allowlist file", "allowlist_file: allow.txt\nsecrets:\n  - {name: A, host: files.example.net, bearer: true}\n", ""},
		{"a host whose first label reads as a key prefix", "allowlist: [sk-proxy.example.com]\nsecrets:\n  - {name: A, host: sk-proxy.example.com, bearer: true}\n", ""},
		{"allowed with rules", "allowlist: [\"api.example.com GET /**\"]\nsecrets:\n  - {name: A, host: api.example.com, bearer: true}\n", ""},
		{"not allowed", "allowlist: [example.com]\nsecrets:\n  - {name: A, host: api.example.com, bearer: true}\n", "abox.yaml:5:21: secrets[0].host: api.example.com: the allowlist does not allow api.example.com, so no request could carry A there; add `- \"api.example.com\"` to allowlist"},
		{"no allowlist", "secrets:\n  - {name: A, host: api.example.com, bearer: true}\n", "the allowlist does not allow api.example.com"},
		{"a wildcard wider than the allowlist", "allowlist: [api.example.com]\nsecrets:\n  - {name: A, host: \"*.example.com\", bearer: true}\n", "the allowlist does not allow every name below example.com"},
		{"a port the proxy does not open", "allowlist: [api.example.com]\nsecrets:\n  - {name: A, host: \"api.example.com:8443\", bearer: true}\n", "port 8443 is not among the proxy's ports (80, 443); add it to ports"},
		{"a port the proxy opens", "allowlist: [api.example.com]\nports: [443, 8443]\nsecrets:\n  - {name: A, host: \"api.example.com:8443\", bearer: true}\n", ""},
		{"interception off", "allowlist: [api.example.com]\nmitm: {enabled: false}\nsecrets:\n  - {name: A, host: api.example.com, bearer: true}\n", "secrets[0]: A: mitm.enabled is false"},
		{"a tunnelled host", "allowlist: [\"*.example.com\"]\nmitm: {exceptions: [api.example.com]}\nsecrets:\n  - {name: A, host: \"*.example.com\", bearer: true}\n", "api.example.com is in mitm.exceptions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := project(t, map[string]string{FileName: "version: 1\nname: dev\n" + tc.src, "allow.txt": "files.example.net\n"})
			p, err := Load(path)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				p.Close()
				return
			}
			if err == nil {
				p.Close()
				t.Fatalf("loaded; want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// TestTrustBySecretBinding: a binding is a widening; against a trusted
// content, a binding to a new host, a wider host, more methods or paths,
// another port or another header asks again, one that is narrowed or
// dropped does not.
func TestTrustBySecretBinding(t *testing.T) {
	const trusted = "version: 1\nname: dev\nallowlist: [\"*.example.com\", other.example.net]\nports: [443, 8443]\nsecrets:\n  - name: API_KEY\n    host: api.example.com\n    bearer: true\n    rules: [\"GET,POST /v1/**\"]\n"
	dir := filepath.Dir(project(t, map[string]string{FileName: trusted}))
	store := TrustStore{Dir: filepath.Join(t.TempDir(), "trust")}
	load := func(t *testing.T, src string) *Project {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := Load(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return p
	}
	var ue *UntrustedError
	if err := store.Check(load(t, trusted)); !errors.As(err, &ue) || !strings.Contains(err.Error(), "secrets: sends API_KEY -> api.example.com [GET,POST /v1/**] as Authorization: Bearer") {
		t.Fatalf("an untrusted binding passes, or is not named: %v", err)
	}
	if err := store.Trust(load(t, trusted)); err != nil {
		t.Fatal(err)
	}
	replace := func(old, new string) string {
		if !strings.Contains(trusted, old) {
			t.Fatalf("%q not in the trusted file", old)
		}
		return strings.Replace(trusted, old, new, 1)
	}
	for _, tc := range []struct{ name, src, since string }{
		{"the same content", trusted + "# reviewed\n", ""},
		{"a rule narrowed", replace("/v1/**", "/v1/chat/**"), ""},
		{"a method dropped", replace("GET,POST", "POST"), ""},
		{"the binding dropped", trusted[:strings.Index(trusted, "secrets:")], ""},
		{"a new host", replace("host: api.example.com", "host: other.example.net"), "secrets: sends API_KEY -> other.example.net"},
		{"a wildcard host", replace("host: api.example.com", `host: "*.example.com"`), "sends API_KEY -> *.example.com"},
		{"another port", replace("host: api.example.com", `host: "api.example.com:8443"`), "api.example.com:8443"},
		{"a method added", replace("GET,POST", "GET,POST,DELETE"), "[GET,POST,DELETE /v1/**]"},
		{"a path widened", replace("/v1/**", "/**"), "[GET,POST /**]"},
		{"the rules dropped", replace("    rules: [\"GET,POST /v1/**\"]\n", ""), "sends API_KEY -> api.example.com as Authorization: Bearer"},
		{"another header", replace("bearer: true", "header: x-api-key"), "as X-Api-Key"},
		{"another secret to the same host", trusted + "  - {name: OTHER_KEY, host: api.example.com, bearer: true, rules: [\"GET /v1/x\"]}\n", "sends OTHER_KEY -> api.example.com"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := store.Check(load(t, tc.src))
			if tc.since == "" {
				if err != nil {
					t.Errorf("a content that only narrows needs trust: %v", err)
				}
				return
			}
			if !errors.As(err, &ue) {
				t.Fatalf("a widening passes: %v", err)
			}
			if !strings.Contains(err.Error(), "beyond the content trusted at") || !strings.Contains(err.Error(), tc.since) {
				t.Errorf("error:\n%v\nwant it to name %q", err, tc.since)
			}
		})
	}
}

// TestSecretBindingCoverage states the trust comparison's claim directly:
// a trusted binding covers another only if every request the other would
// send the secret on it would too, in the same header.
func TestSecretBindingCoverage(t *testing.T) {
	bind := func(host string, rules ...string) secrets.Binding {
		b, err := secrets.ParseBinding(secrets.BindingSpec{Instance: "dev", Host: host, Bearer: true, Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, tc := range []struct {
		name       string
		prev, next secrets.Binding
		covers     bool
	}{
		{"same", bind("a.example.com"), bind("a.example.com"), true},
		{"a wildcard covers a name below it", bind("*.example.com"), bind("a.example.com"), true},
		{"a name does not cover a wildcard", bind("a.example.com"), bind("*.example.com"), false},
		{"another name", bind("a.example.com"), bind("b.example.com"), false},
		{"everything covers rules", bind("a.example.com"), bind("a.example.com", "GET /x"), true},
		{"rules do not cover everything", bind("a.example.com", "GET /**"), bind("a.example.com"), false},
		{"a narrower path", bind("a.example.com", "GET /v1/**"), bind("a.example.com", "GET /v1/x"), true},
		{"another port", bind("a.example.com"), bind("a.example.com:8443"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bindingCovers(secretBaseline{Name: "K", Binding: tc.prev}, Secret{Name: "K", Binding: tc.next})
			if err != nil || got != tc.covers {
				t.Errorf("covers = %v, %v; want %v", got, err, tc.covers)
			}
		})
	}
}
