package daemon

import (
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/secrets"
)

// TestDaemonWiresSecrets: a daemon given the store (SecretsDir) decides
// its instance's placeholders. A placeholder of instance t on a plain
// HTTP request to its bound host is refused (secret_leak: injection is
// for intercepted TLS only); without the wiring it would be forwarded.
func TestDaemonWiresSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	store := secrets.Open(dir)
	if err := store.Set("TOKEN", []byte("tok-daemon-6b1f")); err != nil {
		t.Fatal(err)
	}
	// The port is the origin's, known once the plane runs: bind after.
	p := startPlaneWith(t, DNSConfig{RateLimit: -1}, HTTPConfig{SecretsDir: dir})
	n, _ := strconv.Atoi(p.port)
	b, err := secrets.ParseBinding(secrets.BindingSpec{Instance: "t", Host: "allowed.test:" + strconv.Itoa(n), Bearer: true})
	if err != nil {
		t.Fatal(err)
	}
	ph, err := store.Bind("TOKEN", b)
	if err != nil {
		t.Fatal(err)
	}
	proxy := &url.URL{Scheme: "http", Host: p.info.HTTPAddr.String()}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 10 * time.Second}
	req, _ := http.NewRequest("GET", "http://"+net.JoinHostPort("allowed.test", p.port)+"/", nil)
	req.Header.Set("Authorization", "Bearer "+ph)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretLeak {
		t.Errorf("placeholder over plain HTTP: %d %q, want 403 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), secrets.ReasonSecretLeak)
	}
	if got := p.get(t, "allowed.test"); got != http.StatusOK {
		t.Errorf("a request without the placeholder: %d, want 200", got)
	}
}
