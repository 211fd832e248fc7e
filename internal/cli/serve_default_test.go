package cli

import (
	"bufio"
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
)

// runServe starts a serve command and returns its readiness line (the
// first stderr line starting with prefix); stderr is drained afterwards.
func runServe(t *testing.T, e *env, cmdFor func(*env) interface {
	SetArgs([]string)
	ExecuteContext(context.Context) error
}, args []string, prefix string) string {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	e.stderr = pw
	cmd := cmdFor(e)
	cmd.SetArgs(args)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(6 * time.Second):
			t.Error("serve did not stop")
		}
		pr.Close()
	})
	sc := bufio.NewScanner(pr)
	var line string
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			line = sc.Text()
			break
		}
	}
	go func() {
		for sc.Scan() {
		}
	}()
	if line == "" {
		t.Fatalf("no readiness line")
	}
	return line
}

func apiMode(t *testing.T, e *env, name string) policy.Mode {
	t.Helper()
	l, _ := e.layout()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := api.NewClient(l.APISocket(name)).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode
}

// TestServeCommandsStartActive: without --passive, abox dns serve and abox
// http serve enforce the allowlist from the first query: a name that is not
// listed is refused, and the API reports active mode.
func TestServeCommandsStartActive(t *testing.T) {
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("dns", func(t *testing.T) {
		up := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14", "unlisted.example.org. 60 IN A 93.184.215.15")
		e, _ := testEnv(t)
		line := runServe(t, e, func(e *env) interface {
			SetArgs([]string)
			ExecuteContext(context.Context) error
		} {
			return newDNSServeCmd(e)
		}, []string{"--listen", "127.0.0.1:0", "--allowlist", allow, "--upstream", up.Addr, "--name", "ds", "--log-file", filepath.Join(t.TempDir(), "dns.log")}, "abox: dns filter")
		i, j := strings.Index(line, " on "), strings.Index(line, " (udp+tcp)")
		if i < 0 || j < i {
			t.Fatalf("readiness line %q lacks the address", line)
		}
		r, _, err := (&dns.Client{Timeout: 3 * time.Second}).Exchange(new(dns.Msg).SetQuestion("unlisted.example.org.", dns.TypeA), line[i+4:j])
		// (The daemon's own NAT64 discovery asks for ipv4only.arpa.)
		if n := up.CountFor("unlisted.example.org"); err != nil || r.Rcode != dns.RcodeNameError || n != 0 {
			t.Errorf("unlisted name: %v %v (upstream asked %d times), want NXDOMAIN without a lookup", r, err, n)
		}
		if m := apiMode(t, e, "ds"); m != policy.Active {
			t.Errorf("mode %s, want active", m)
		}
	})
	t.Run("http", func(t *testing.T) {
		e, _ := testEnv(t)
		line := runServe(t, e, func(e *env) interface {
			SetArgs([]string)
			ExecuteContext(context.Context) error
		} {
			return newHTTPServeCmd(e)
		}, []string{"--listen", "127.0.0.1:0", "--allowlist", allow, "--upstream", "127.0.0.1:1", "--name", "hs"}, "abox: http filter")
		i, j := strings.Index(line, " on "), strings.Index(line, ", ports")
		if i < 0 || j < i {
			t.Fatalf("readiness line %q lacks the address", line)
		}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: line[i+4 : j]})}}
		resp, err := c.Get("http://unlisted.example.org/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != "not_allowlisted" {
			t.Errorf("unlisted name: %d %s, want 403 not_allowlisted", resp.StatusCode, resp.Header.Get("X-Abox-Reason"))
		}
		if m := apiMode(t, e, "hs"); m != policy.Active {
			t.Errorf("mode %s, want active", m)
		}
	})
}
