package cli

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
)

func testEnv(t *testing.T) (*env, *bytes.Buffer) {
	t.Helper()
	root := t.TempDir()
	var out bytes.Buffer
	return &env{stdin: strings.NewReader(""), stdout: &out, stderr: &out,
		layout: func() (paths.Layout, error) { return paths.Layout{Root: root}, nil }}, &out
}

// TestDNSServeFlagErrors: bad input fails before anything starts, with an
// error naming the fix.
func TestDNSServeFlagErrors(t *testing.T) {
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	if err := os.WriteFile(bad, []byte("example.com\n*\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing allowlist", []string{"--allowlist", "/nonexistent/allow.txt", "--upstream", "127.0.0.1"}, "does not exist"},
		{"default allowlist missing", []string{"--upstream", "127.0.0.1"}, "does not exist"},
		{"invalid allowlist", []string{"--allowlist", bad, "--upstream", "127.0.0.1"}, "bad.txt:2"},
		{"bad CIDR", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--allow-private", "10.0.0.0/33"}, "not a CIDR"},
		{"allow-private /0", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--allow-private", "0.0.0.0/0"}, "a /0 would permit every address"},
		{"allow-host /0", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--allow-host", "::/0"}, "--allow-host"},
		{"upstream host name", []string{"--allowlist", allow, "--upstream", "dns.google"}, "want IP or IP:PORT"},
		{"bad listen", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--listen", "localhost:53"}, "not an IP address"},
		{"bad name", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--name", "../x"}, "--name"},
		{"metrics on every address", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--metrics-listen", "0.0.0.0:9153"}, "not a loopback address"},
		{"ttl order", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--min-ttl", "10m"}, "--min-ttl"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := testEnv(t)
			cmd := newDNSServeCmd(e)
			cmd.SetArgs(tt.args)
			cmd.SetOut(e.stdout)
			cmd.SetErr(e.stderr)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			var he *hintError
			if tt.name == "missing allowlist" && (!errors.As(err, &he) || he.hint == "") {
				t.Errorf("missing allowlist: no hint on %v", err)
			}
		})
	}
}

// TestDNSServeRuns: the command serves, answers, and stops cleanly on cancel.
func TestDNSServeRuns(t *testing.T) {
	up := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14")
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, out := testEnv(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	e.stderr = pw
	cmd := newDNSServeCmd(e)
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0", "--allowlist", allow, "--upstream", up.Addr, "--log-file", filepath.Join(t.TempDir(), "dns.log")})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	buf := make([]byte, 4096)
	n, err := pr.Read(buf)
	if err != nil {
		t.Fatalf("reading readiness line: %v", err)
	}
	line := string(buf[:n])
	i := strings.Index(line, " on ")
	j := strings.Index(line, " (udp+tcp)")
	if i < 0 || j < i {
		t.Fatalf("readiness line %q lacks the address", line)
	}
	addr := line[i+4 : j]
	m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("query through abox dns serve: %v %v", r, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(6 * time.Second):
		t.Fatal("serve did not stop within 6s of cancel")
	}
	_ = out
}
