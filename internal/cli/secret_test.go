package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
)

// runCLIIn runs one command with stdin.
func runCLIIn(l paths.Layout, stdin string, args ...string) (string, string, error) {
	var out, errb strings.Builder
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb, layout: func() (paths.Layout, error) { return l, nil }}
	root := newRootCmd(e)
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err := root.ExecuteContext(context.Background())
	return out.String(), errb.String(), err
}

func TestSecretCommands(t *testing.T) {
	const value = "sk-cli-test-0a1b2c3d4e5f"
	root := t.TempDir()
	l := paths.Layout{Root: root}
	saveState(t, root, instance.State{Name: "dev", Gateway: netip.MustParseAddr("10.10.9.1")})
	var texts []string
	run := func(stdin string, args ...string) (string, error) {
		out, errs, err := runCLIIn(l, stdin, args...)
		texts = append(texts, out, errs)
		if err != nil {
			texts = append(texts, err.Error())
		}
		return out + errs, err
	}
	if _, err := run("", "secret", "set", "TOK", value); err == nil || !strings.Contains(err.Error(), "never from an argument") {
		t.Fatalf("set with the value as an argument = %v", err)
	}
	if _, err := run("", "secret", "set", "TOK"); err == nil || !strings.Contains(err.Error(), "no value") {
		t.Fatalf("set with empty stdin = %v", err)
	}
	if _, err := run(value+"\n", "secret", "set", "TOK"); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "v")
	os.WriteFile(f, []byte("from-file-value\n"), 0o600)
	if _, err := run("", "secret", "set", "FILETOK", "--from-file", f); err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "secret", "bind", "TOK", "--instance", "dev", "--host", "api.example.com", "--rule", "POST /v1/**", "--bearer"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"secret", "bind", "TOK", "--instance", "nosuch", "--host", "api.example.com", "--bearer"}, "does not exist"},
		{[]string{"secret", "bind", "TOK", "--instance", "dev", "--host", "api.example.com"}, "--bearer, --basic USER or --header NAME"},
		{[]string{"secret", "bind", "TOK", "--instance", "dev", "--host", "*.com", "--bearer"}, "top-level"},
		{[]string{"secret", "bind", "TOK", "--instance", "dev", "--bearer"}, "--host"},
		{[]string{"secret", "bind", "NOPE", "--instance", "dev", "--host", "a.example.com", "--bearer"}, "abox secret set NOPE"},
		{[]string{"secret", "set", "bad-name"}, "environment variable name"},
		{[]string{"secret", "rm", "NOPE"}, "no such secret"},
	} {
		if _, err := run(value, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v = %v; want an error with %q", c.args, err, c.want)
		}
	}
	out, err := run("", "secret", "list")
	if err != nil || !strings.Contains(out, "TOK") || !strings.Contains(out, "api.example.com [POST /v1/**] as Authorization: Bearer") {
		t.Fatalf("list = %v\n%s", err, out)
	}
	out, err = run("", "secret", "list", "--json")
	var list []map[string]any
	if err != nil || json.Unmarshal([]byte(out), &list) != nil || len(list) != 2 {
		t.Fatalf("list --json = %v\n%s", err, out)
	}
	out, err = run("", "secret", "env", "--instance", "dev")
	if err != nil || !strings.HasPrefix(out, "export TOK=abox-ph-") {
		t.Fatalf("env = %v\n%s", err, out)
	}
	if _, err := run("", "secret", "unbind", "TOK", "--instance", "dev", "--host", "api.example.com"); err != nil {
		t.Fatal(err)
	}
	if _, err := run("", "secret", "rm", "TOK"); err != nil {
		t.Fatal(err)
	}
	// Neither the CLI's output and errors nor any file it wrote outside
	// the value files holds a value.
	for _, s := range texts {
		if strings.Contains(s, value) || strings.Contains(s, "from-file-value") {
			t.Errorf("output holds a value: %q", s)
		}
	}
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == filepath.Join(l.Secrets(), "values", "FILETOK") {
			return err
		}
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte("from-file-value")) {
			t.Errorf("%s holds a value", p)
		}
		return nil
	})
}
