package tetragon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// release serves body over HTTPS (a real TLS server on loopback).
func release(t *testing.T, body []byte) (*httptest.Server, *int) {
	t.Helper()
	hits := new(int)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*hits++
		switch r.URL.Path {
		case "/to-http":
			http.Redirect(w, r, "http://"+r.Host+"/tetragon.tar.gz", http.StatusFound)
		default:
			w.Write(body)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}

func cacheEntries(t *testing.T, c Cache) []string {
	t.Helper()
	es, err := os.ReadDir(c.Dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestFetchVerifiesAndCaches(t *testing.T) {
	body := tarball(t, goodEntries("tetragon-v1.7.1-amd64/"))
	srv, hits := release(t, body)
	c := Cache{Dir: t.TempDir() + "/cache"}
	rel := Release{Version: "v-test", URL: srv.URL + "/tetragon.tar.gz", SHA256: digest(body)}
	p, info, err := c.Fetch(context.Background(), srv.Client(), rel)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, body) || info.SHA256 != rel.SHA256 || info.Prefix != "tetragon-v1.7.1-amd64" {
		t.Fatalf("cached %s: %d bytes, %+v", p, len(got), info)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Errorf("cached bundle mode %v", fi.Mode())
	}
	// The second fetch is served from the cache.
	if _, _, err := c.Fetch(context.Background(), srv.Client(), rel); err != nil || *hits != 1 {
		t.Errorf("second fetch: %v, %d downloads", err, *hits)
	}
}

func TestFetchRefusesAChecksumMismatch(t *testing.T) {
	body := tarball(t, goodEntries(""))
	srv, _ := release(t, body)
	c := Cache{Dir: t.TempDir() + "/cache"}
	wrong := strings.Repeat("ab", 32)
	_, _, err := c.Fetch(context.Background(), srv.Client(), Release{Version: "v-test", URL: srv.URL + "/t.tar.gz", SHA256: wrong})
	var ce *ChecksumError
	if !errors.As(err, &ce) || ce.Got != digest(body) || ce.Want != wrong {
		t.Fatalf("mismatch accepted or misreported: %v", err)
	}
	if es := cacheEntries(t, c); len(es) != 0 {
		t.Errorf("a refused download left %v in the cache", es)
	}
	// A cached file that no longer matches its name is not used either.
	os.WriteFile(c.Path(wrong), body, 0o600)
	if _, _, ok := c.Cached(wrong); ok {
		t.Error("a cached file whose digest is not its name was used")
	}
}

func TestFetchRefusesPlainHTTP(t *testing.T) {
	hit := false
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit = true }))
	defer plain.Close()
	c := Cache{Dir: t.TempDir()}
	_, _, err := c.Fetch(context.Background(), nil, Release{Version: "v-test", URL: plain.URL + "/t.tar.gz", SHA256: strings.Repeat("0", 64)})
	if err == nil || !strings.Contains(err.Error(), "https only") || !strings.Contains(err.Error(), "--monitor-bundle") || hit {
		t.Fatalf("http:// download: %v (server contacted: %v)", err, hit)
	}
	// Nor may an https URL redirect to http.
	body := tarball(t, goodEntries(""))
	srv, _ := release(t, body)
	_, _, err = c.Fetch(context.Background(), srv.Client(), Release{Version: "v-test", URL: srv.URL + "/to-http", SHA256: digest(body)})
	if err == nil || !strings.Contains(err.Error(), "not https") {
		t.Fatalf("redirect to http: %v", err)
	}
	// And without a pinned digest there is no download at all.
	if _, _, err := c.Fetch(context.Background(), srv.Client(), Release{Version: "v-test", URL: srv.URL}); err == nil || !strings.Contains(err.Error(), "--monitor-bundle FILE") {
		t.Fatalf("unpinned release: %v", err)
	}
}

func TestImportValidatesTheCachedCopy(t *testing.T) {
	dir := t.TempDir()
	c := Cache{Dir: dir + "/cache"}
	bad := dir + "/bad.tar.gz"
	os.WriteFile(bad, tarball(t, append(goodEntries(""), entry{name: "/etc/shadow", body: "x"})), 0o644)
	if _, _, err := c.Import(bad, ""); err == nil {
		t.Fatal("hostile bundle imported")
	}
	if es := cacheEntries(t, c); len(es) != 0 {
		t.Errorf("a refused bundle left %v in the cache", es)
	}
	good := dir + "/good.tar.gz"
	body := tarball(t, goodEntries(""))
	os.WriteFile(good, body, 0o644)
	p, info, err := c.Import(good, "")
	if err != nil || p != c.Path(digest(body)) || info.SHA256 != digest(body) {
		t.Fatalf("import: %s %+v %v", p, info, err)
	}
}

func TestPinnedReleaseIsHTTPSAndPinned(t *testing.T) {
	if !strings.HasPrefix(Pinned.URL, "https://github.com/cilium/tetragon/releases/download/"+Pinned.Version+"/") || len(Pinned.SHA256) != 64 {
		t.Errorf("pinned release %+v", Pinned)
	}
}
