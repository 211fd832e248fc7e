package config

import (
	"reflect"
	"strings"
	"testing"
)

// TestAllowlistPushLines: a push line passes through abox.yaml as any
// allowlist line, beside a name listed with rules or without.
func TestAllowlistPushLines(t *testing.T) {
	src := `version: 1
name: dev
allowlist:
  - code.example.com
  - "code.example.com push refs/heads/agent/*"
  - host: git.example.org
    rules: ["GET /**", "POST /acme/app.git/git-receive-pack"]
  - "git.example.org push refs/heads/agent/** delete"
`
	c, err := parse(t, src)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ln := range c.Allowlist {
		got = append(got, ln.String())
	}
	want := []string{
		"code.example.com",
		"code.example.com push refs/heads/agent/*",
		"git.example.org GET /**",
		"git.example.org POST /acme/app.git/git-receive-pack",
		"git.example.org push refs/heads/agent/** delete",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("lines:\n got %q\nwant %q", got, want)
	}
	for _, tc := range []struct{ src, want string }{
		{"  - \"code.example.com push main\"\n", `abox.yaml:4:5: allowlist[0]: code.example.com: push pattern "main" is not a full ref name: write refs/heads/main`},
		{"  - \"code.example.com push refs/heads/agent/*\"\n", "code.example.com has push rules but no line lists it"},
	} {
		_, err := parse(t, "version: 1\nname: dev\nallowlist:\n"+tc.src)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.src, err, tc.want)
		}
	}
}
