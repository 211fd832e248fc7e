package image

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCheckDownloadURL(t *testing.T) {
	for _, tt := range []struct {
		url string
		ok  bool
	}{
		{"https://cloud.debian.org/images/x.qcow2", true},
		{"https://10.0.0.1/x", true},
		{"http://127.0.0.1:8080/x", true},
		{"http://[::1]/x", true},
		{"http://localhost/x", true},
		{"http://cloud.debian.org/images/x.qcow2", false},
		{"http://10.0.0.1/x", false},
		{"http://127.0.0.1.example/x", false},
		{"ftp://127.0.0.1/x", false},
		{"file:///etc/shadow", false},
		{"/etc/shadow", false},
	} {
		err := CheckDownloadURL(tt.url)
		if (err == nil) != tt.ok {
			t.Errorf("CheckDownloadURL(%q) = %v, want ok=%v", tt.url, err, tt.ok)
		}
	}
}

// TestPullRefusesPlainHTTP: neither the URL given nor a redirect from an
// https server may lead to plain http off this machine; nothing is
// fetched from such a URL and nothing is installed.
func TestPullRefusesPlainHTTP(t *testing.T) {
	var hits int
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		http.Redirect(w, r, "http://mirror.invalid/x.qcow2", http.StatusFound)
	}))
	defer srv.Close()
	s := NewStore(t.TempDir(), &fakeRunner{}, srv.Client())
	sum, _ := ParseChecksum(SHA256, strings.Repeat("0", 64))

	_, err := s.PullChecksum(context.Background(), "x", "http://mirror.invalid/x.qcow2", sum, nil)
	if !errors.Is(err, ErrInsecureURL) {
		t.Errorf("pull over http = %v, want ErrInsecureURL", err)
	}
	_, err = s.PullChecksum(context.Background(), "x", srv.URL+"/x.qcow2", sum, nil)
	if !errors.Is(err, ErrInsecureURL) || !strings.Contains(err.Error(), "redirected") {
		t.Errorf("pull redirected to http = %v, want ErrInsecureURL on the redirect", err)
	}
	if hits != 1 {
		t.Errorf("server saw %d requests, want 1 (the https one)", hits)
	}
	if got := leftovers(t, s); len(got) != 0 {
		t.Errorf("images dir holds %q, want nothing", got)
	}
}
