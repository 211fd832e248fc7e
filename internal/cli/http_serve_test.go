package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/paths"
)

func TestHTTPServeFlagErrors(t *testing.T) {
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	base := []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--listen", "127.0.0.1:0"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing allowlist", []string{"--allowlist", "/nonexistent/allow.txt", "--upstream", "127.0.0.1"}, "does not exist"},
		{"bad ports", append(base, "--ports", "80,http"), "--ports"},
		{"port zero", append(base, "--ports", "0"), "--ports"},
		{"bad CIDR", append(base, "--allow-private", "10.0.0.0/33"), "not a CIDR"},
		{"allow-private /0", append(base, "--allow-private", "0.0.0.0/0"), "a /0 would permit every address"},
		{"allow-host /0", append(base, "--allow-host", "::/0"), "--allow-host"},
		{"upstream host name", append(base, "--upstream", "dns.google"), "want IP or IP:PORT"},
		{"bad listen", []string{"--allowlist", allow, "--upstream", "127.0.0.1", "--listen", "localhost:3128"}, "--listen"},
		{"bad name", append(base, "--name", "../x"), "--name"},
		{"bad upstream ca", append(base, "--upstream-ca", allow), "no PEM certificate"},
		{"bad exception", append(base, "--mitm-exception", "a b"), "mitm exception"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, _ := testEnv(t)
			cmd := newHTTPServeCmd(e)
			cmd.SetArgs(tt.args)
			cmd.SetOut(e.stdout)
			cmd.SetErr(e.stderr)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := cmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestHTTPServeRuns: the command serves the healthcheck over HTTP and
// intercepted HTTPS (the CA exists before the first CONNECT), switches the
// key log through the API and stops cleanly.
func TestHTTPServeRuns(t *testing.T) {
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e, _ := testEnv(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	e.stderr = pw
	cmd := newHTTPServeCmd(e)
	cmd.SetArgs([]string{"--listen", "127.0.0.1:0", "--allowlist", allow, "--upstream", "127.0.0.1:1", "--name", "hs"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	// stderr carries the JSON diagnostics too; find the readiness line and
	// keep draining so the server never blocks on a full pipe.
	sc := bufio.NewScanner(pr)
	var line string
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "abox: http filter") {
			line = sc.Text()
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	i, j := strings.Index(line, " on "), strings.Index(line, ", ports")
	if i < 0 || j < i {
		t.Fatalf("readiness line %q lacks the address", line)
	}
	proxyURL := &url.URL{Scheme: "http", Host: line[i+4 : j]}
	l, _ := e.layout()
	pem, err := os.ReadFile(filepath.Join(l.CADir("hs"), "ca.crt"))
	if err != nil {
		t.Fatalf("CA not created at start: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for _, u := range []string{"http://healthcheck.abox.local/", "https://healthcheck.abox.local/"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "healthy") {
			t.Errorf("%s: %d %q", u, resp.StatusCode, b)
		}
	}
	ac := api.NewClient(l.APISocket("hs"))
	ks, err := ac.SetKeyLog(ctx, true)
	if err != nil || !ks.Enabled || ks.Path != (paths.Layout{Root: l.Root}).KeyLog("hs") {
		t.Errorf("SetKeyLog: %+v %v", ks, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("serve did not stop within 8s of cancel")
	}
}
