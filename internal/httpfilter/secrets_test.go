package httpfilter

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/secrets"
)

// tokenOrigin is the stand-in API: it accepts only "Authorization: Bearer
// <want>", sent once, and answers 401 otherwise. It records what it read.
type tokenOrigin struct {
	mu    sync.Mutex
	want  string
	got   [][]string // the Authorization values of every request read
	proto []string
	uris  []string // the request-targets read
	// bodies holds what the origin read of each request body, cut or
	// not, and its trailer fields.
	bodies []string
}

func (o *tokenOrigin) setWant(v string) {
	o.mu.Lock()
	o.want = v
	o.mu.Unlock()
}

func (o *tokenOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	o.bodies = append(o.bodies, string(body)+fmt.Sprint(r.Trailer))
	auth := r.Header.Values("Authorization")
	o.got = append(o.got, auth)
	o.proto = append(o.proto, r.Proto)
	o.uris = append(o.uris, r.RequestURI)
	ok := len(auth) == 1 && auth[0] == "Bearer "+o.want
	o.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusUnauthorized)
		io.WriteString(w, "want the real token\n")
		return
	}
	io.WriteString(w, "ok\n")
}

func (o *tokenOrigin) take() [][]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	g := o.got
	o.got = nil
	return g
}

// secretsFixture is a proxy of instance dev with TOKEN bound to api.test
// (bearer), an HTTPS origin there that wants the real value, and
// other.test, allowed, bound to nothing.
type secretsFixture struct {
	h         *harness
	store     *secrets.Store
	ph        string
	api       *tokenOrigin
	other     *tokenOrigin
	apiPort   string
	otherPort string
	plainPort string // a plain-HTTP origin on api.test
	values    []string
}

const testInstance = "dev"

func newSecretsFixture(t *testing.T, rules ...string) *secretsFixture {
	t.Helper()
	return newSecretsFixtureAllowing(t, []string{"api.test", "other.test", "late.test"}, rules...)
}

// newSecretsFixtureAllowing is newSecretsFixture with the allowlist's
// lines, which must allow api.test and other.test.
func newSecretsFixtureAllowing(t *testing.T, allow []string, rules ...string) *secretsFixture {
	t.Helper()
	f := &secretsFixture{api: &tokenOrigin{}, other: &tokenOrigin{}}
	// The store is outside the proxy's directory: its value file is the
	// one place the value may be.
	f.store = secrets.Open(filepath.Join(t.TempDir(), "secrets"))
	f.h = newHarness(t, hopts{allow: allow, secrets: f.store.Source(testInstance)})
	apiSrv := newHTTPSOrigin(t, f.api)
	otherSrv := newHTTPSOrigin(t, f.other)
	plainSrv := newHTTPOrigin(t, f.api)
	f.apiPort, f.otherPort, f.plainPort = port(t, apiSrv), port(t, otherSrv), port(t, plainSrv)
	f.h.allowOrigin("api.test", apiSrv, f.apiPort)
	f.h.allowOrigin("other.test", otherSrv, f.otherPort)
	f.h.allowOrigin("api.test", plainSrv, f.plainPort)
	f.rotate(t, "tok-first-4f1d9c")
	b, err := secrets.ParseBinding(secrets.BindingSpec{Instance: testInstance, Host: "api.test:" + f.apiPort, Bearer: true, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	if f.ph, err = f.store.Bind("TOKEN", b); err != nil {
		t.Fatal(err)
	}
	// A binding of the plain origin's port too: the request is bound,
	// and refused only because it is not TLS.
	b.Port = uint16(mustAtoi(f.plainPort))
	if _, err := f.store.Bind("TOKEN", b); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.assertNoValue(t) })
	return f
}

// rotate sets TOKEN's value (abox secret set again) and what the origin wants.
func (f *secretsFixture) rotate(t *testing.T, v string) {
	t.Helper()
	if err := f.store.Set("TOKEN", []byte(v)); err != nil {
		t.Fatal(err)
	}
	f.api.setWant(v)
	f.values = append(f.values, v)
}

// do sends one request from the guest through the proxy.
func (f *secretsFixture) do(t *testing.T, c *http.Client, method, url, auth, body string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, v := range f.values {
		if strings.Contains(string(b), v) || strings.Contains(fmt.Sprint(resp.Header), v) {
			t.Errorf("the guest's answer holds the value: %q", b)
		}
	}
	return resp, string(b)
}

// assertNoValue searches every log line, diagnostic and file the proxy
// wrote for any value TOKEN had.
func (f *secretsFixture) assertNoValue(t *testing.T) {
	t.Helper()
	texts := map[string]string{"decision log": f.h.log.String(), "diagnostics": f.h.diag.String()}
	dir := filepath.Dir(filepath.Dir(f.h.keyLog))
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			texts[p] = string(b)
		}
		return nil
	})
	for where, s := range texts {
		for _, v := range f.values {
			if strings.Contains(s, v) {
				t.Errorf("%s holds the value %q", where, v)
			}
		}
		if f.ph != "" && strings.Contains(strings.ToLower(s), f.ph) {
			t.Errorf("%s holds the placeholder", where)
		}
	}
}

// TestSecretInjected: on intercepted HTTP/1.1 and HTTP/2, a request to the
// bound host gets the real value in place of the placeholder, in place of
// the guest's own credential, or where it sent none; the origin accepts
// only the real token, and reads exactly one Authorization.
func TestSecretInjected(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newSecretsFixture(t)
			c := f.h.client(h2)
			url := "https://api.test:" + f.apiPort + "/v1/models"
			for _, tc := range []struct{ name, auth string }{
				{"placeholder", "Bearer " + f.ph},
				{"guest's own credential", "Bearer guest-own-token"},
				{"none", ""},
			} {
				t.Run(tc.name, func(t *testing.T) {
					resp, body := f.do(t, c, "GET", url, tc.auth, "")
					if resp.StatusCode != 200 {
						t.Fatalf("status %d (%q), want 200: the origin got %q", resp.StatusCode, body, f.api.take())
					}
					if h2 && resp.ProtoMajor != 2 {
						t.Errorf("guest spoke %s, want HTTP/2", resp.Proto)
					}
					if got := f.api.take(); len(got) != 1 || len(got[0]) != 1 {
						t.Errorf("origin read Authorization %q, want exactly one value", got)
					}
					line := f.h.waitLine(t, "injected", "TOKEN")
					if line["verdict"] != "allow" {
						t.Errorf("line %v: want an allowed request naming TOKEN", line)
					}
				})
			}
			// A rotation reaches the next request, on the same connection,
			// without a restart.
			f.rotate(t, "tok-second-8e2a71")
			if resp, body := f.do(t, c, "GET", url, "Bearer "+f.ph, ""); resp.StatusCode != 200 {
				t.Fatalf("after rotation: status %d (%q), want 200 with the new value", resp.StatusCode, body)
			}
			if info, err := f.store.List(); err != nil || len(info) != 1 || info[0].LastUsed.IsZero() {
				t.Errorf("abox secret list: %+v %v: want TOKEN with a last use", info, err)
			}
		})
	}
}

// TestSecretLeakRefused: a placeholder anywhere the binding does not cover
// is refused with secret_leak, a denial id and a line naming the secret
// (not the placeholder), and nothing reaches an origin.
func TestSecretLeakRefused(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newSecretsFixture(t)
			c := f.h.client(h2)
			api := "https://api.test:" + f.apiPort
			cases := []struct {
				name, method, url, auth, body, where, detail string
			}{
				{"header to another allowed host", "GET", "https://other.test:" + f.otherPort + "/", "Bearer " + f.ph, "", "header Authorization", secrets.DetailNotBound},
				{"query", "GET", api + "/v1/models?key=" + f.ph, "", "", secrets.WhereQuery, secrets.DetailPlacement},
				{"path", "GET", api + "/v1/" + f.ph, "", "", secrets.WherePath, secrets.DetailPlacement},
				{"body", "POST", api + "/v1/chat", "", `{"note":"` + f.ph + `"}`, secrets.WhereBody, secrets.DetailPlacement},
				{"body after other bytes", "POST", api + "/v1/chat", "", strings.Repeat("x", 40000) + f.ph, secrets.WhereBody, secrets.DetailPlacement},
				{"body of a large upload", "POST", api + "/v1/files", "", f.ph + strings.Repeat("y", 300000), secrets.WhereBody, secrets.DetailPlacement},
				{"plain http", "GET", "http://api.test:" + f.plainPort + "/v1/models", "Bearer " + f.ph, "", "header Authorization", secrets.DetailPlainHTTP},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					resp, body := f.do(t, c, tc.method, tc.url, tc.auth, tc.body)
					if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretLeak {
						t.Fatalf("status %d reason %q (%q), want 403 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body, secrets.ReasonSecretLeak)
					}
					id := resp.Header.Get("X-Abox-Denial-Id")
					if id == "" || !strings.Contains(body, id) || !strings.Contains(body, "secret TOKEN") {
						t.Errorf("body %q: want the secret's name and the denial id %q", body, id)
					}
					if strings.Contains(body, f.ph) {
						t.Errorf("body %q repeats the placeholder", body)
					}
					if got, other := f.api.take(), f.other.take(); len(got)+len(other) != 0 {
						t.Errorf("refused, but the origins read %q %q", got, other)
					}
					// The connection still serves the next request.
					if resp, body := f.do(t, c, "GET", api+"/v1/models", "", ""); resp.StatusCode != 200 {
						t.Errorf("the request after the refusal: %d %q", resp.StatusCode, body)
					}
					f.api.take()
					line := f.h.waitLine(t, "denial_id", id)
					want := fmt.Sprintf("secret_leak: secret TOKEN in the %s (%s)", tc.where, tc.detail)
					if line["reason"] != secrets.ReasonSecretLeak || line["secret"] != want {
						t.Errorf("line %v: want reason secret_leak and secret %q", line, want)
					}
				})
			}
		})
	}
}

// TestSecretUnavailable: a value that cannot be read refuses the request
// (secret_unavailable) rather than sending it without, or with the
// guest's credential.
func TestSecretUnavailable(t *testing.T) {
	f := newSecretsFixture(t)
	if err := f.store.SetCommand("TOKEN", "exit 3", time.Second); err != nil {
		t.Fatal(err)
	}
	resp, body := f.do(t, f.h.client(false), "GET", "https://api.test:"+f.apiPort+"/", "Bearer guest-own", "")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretUnavailable {
		t.Fatalf("status %d reason %q (%q), want 403 secret_unavailable", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body)
	}
	if got := f.api.take(); len(got) != 0 {
		t.Errorf("the origin read %q", got)
	}
}

// TestSecretBodyReplayed: the body prefix read for the decision is sent
// upstream whole, past the prefix too.
func TestSecretBodyReplayed(t *testing.T) {
	f := newSecretsFixture(t)
	var got int
	srv := newHTTPSOrigin(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Header.Get("Authorization") != "Bearer "+f.values[len(f.values)-1] {
			w.WriteHeader(401)
		}
		got = len(b)
		if !bytes.Equal(b, bytes.Repeat([]byte("ab"), len(b)/2)) {
			got = -1
		}
	}))
	pt := port(t, srv)
	f.h.allowOrigin("api.test", srv, pt)
	b, _ := secrets.ParseBinding(secrets.BindingSpec{Instance: testInstance, Host: "api.test:" + pt, Bearer: true})
	if _, err := f.store.Bind("TOKEN", b); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{10, MaxSecretBodyScan, 3 * MaxSecretBodyScan} {
		resp, body := f.do(t, f.h.client(false), "POST", "https://api.test:"+pt+"/", "", strings.Repeat("ab", n/2))
		if resp.StatusCode != 200 || got != n/2*2 {
			t.Errorf("%d bytes: status %d (%q), origin read %d bytes", n, resp.StatusCode, body, got)
		}
	}
}

// keyRandoms returns the client randoms of an NSS key log.
func keyRandoms(b []byte) map[string]bool {
	m := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 {
			m[f[1]] = true
		}
	}
	return m
}

// TestSecretSessionKeysWithheld: the TLS keys of a session that carried an
// injected value never reach the key log; a session to the bound host that
// injected nothing, and one to another host, are logged as before. The
// opt-in logs them all.
func TestSecretSessionKeysWithheld(t *testing.T) {
	f := newSecretsFixture(t, "GET /v1/**")
	if err := f.h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	// session opens one guest TLS session to authority, sends one GET of
	// path and returns the client randoms the guest logged.
	session := func(t *testing.T, authority, path string) map[string]bool {
		t.Helper()
		var kl bytes.Buffer
		tc := tls.Client(f.h.connect(t, authority), &tls.Config{RootCAs: f.h.proxyCA, ServerName: strings.Split(authority, ":")[0], NextProtos: []string{"http/1.1"}, KeyLogWriter: &kl})
		tc.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n", path, authority, f.ph)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		tc.Close()
		return keyRandoms(kl.Bytes())
	}
	waitWithheld := func(t *testing.T, n uint64) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); f.h.p.KeyLogWithheld() != n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions withheld, want %d", f.h.p.KeyLogWithheld(), n)
			}
		}
	}
	logged := func(t *testing.T, randoms map[string]bool) bool {
		t.Helper()
		b, _ := os.ReadFile(f.h.keyLog)
		in := keyRandoms(b)
		for r := range randoms {
			if in[r] {
				return true
			}
		}
		return false
	}
	api := "api.test:" + f.apiPort
	injected := session(t, api, "/v1/models")
	waitWithheld(t, 1)
	if len(injected) == 0 || logged(t, injected) {
		t.Errorf("the keys of the session that injected are in the key log (%d randoms)", len(injected))
	}
	// The placeholder off the rules is refused: nothing injected.
	plain := session(t, api, "/public")
	other := session(t, "other.test:"+f.otherPort, "/")
	for deadline := time.Now().Add(5 * time.Second); !logged(t, plain) && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
	}
	if !logged(t, plain) || !logged(t, other) {
		t.Errorf("sessions that injected nothing are missing from the key log (bound host %v, other host %v)", logged(t, plain), logged(t, other))
	}
	if n := f.h.p.KeyLogWithheld(); n != 1 {
		t.Errorf("%d sessions withheld, want 1", n)
	}
	if err := f.h.p.SetKeyLogSecretSessions(true); err != nil {
		t.Fatal(err)
	}
	optIn := session(t, api, "/v1/models")
	for deadline := time.Now().Add(5 * time.Second); !logged(t, optIn) && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
	}
	if !logged(t, optIn) {
		t.Errorf("opted in, the keys of a session that injected are not in the key log")
	}
	// Switching the log off ends the opt-in.
	f.h.p.SetKeyLog(false)
	f.h.p.SetKeyLog(true)
	if f.h.p.KeyLogSecretSessions() {
		t.Errorf("the opt-in outlived switching the key log off")
	}
}

// TestSecretKeysLoggedBeforeBinding: a binding added while a session is
// open, after its keys were logged, is refused on that session rather than
// injected into a capture that can be decrypted.
func TestSecretKeysLoggedBeforeBinding(t *testing.T) {
	f := newSecretsFixture(t)
	if err := f.h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	o := &tokenOrigin{}
	srv := newHTTPSOrigin(t, o)
	pt := port(t, srv)
	f.h.allowOrigin("late.test", srv, pt)
	tc := tls.Client(f.h.connect(t, "late.test:"+pt), &tls.Config{RootCAs: f.h.proxyCA, ServerName: "late.test", NextProtos: []string{"http/1.1"}})
	defer tc.Close()
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	b, _ := secrets.ParseBinding(secrets.BindingSpec{Instance: testInstance, Host: "late.test:" + pt, Bearer: true})
	if _, err := f.store.Bind("TOKEN", b); err != nil {
		t.Fatal(err)
	}
	tc.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: late.test:%s\r\n\r\n", pt)
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretUnavailable {
		t.Errorf("status %d reason %q, want 403 secret_unavailable", resp.StatusCode, resp.Header.Get("X-Abox-Reason"))
	}
	if got := o.take(); len(got) != 0 {
		t.Errorf("the origin read %q", got)
	}
}

// TestSecretBindingRulesDecideTheSentPath: a binding's rules on a host
// without request rules of its own decide the canonical path, so the
// request that gets the value goes upstream in that form: spelled with
// dot segments, empty segments or encoded dots, it would otherwise read
// as another path to an origin that resolves them (/admin//../repos/me/x
// is /admin/repos/me/x to RFC 3986, /repos/me/x to the rules).
func TestSecretBindingRulesDecideTheSentPath(t *testing.T) {
	f := newSecretsFixture(t, "PUT /repos/me/**")
	for _, h2 := range []bool{false, true} {
		c := f.h.client(h2)
		for _, p := range []string{"/admin//../repos/me/x", "/repos/victim/repo/contents//..//..//..//../repos/me/x", "/admin/%2e%2e/repos/me/x", "/repos/me/x?b=%41&a=1"} {
			f.api.mu.Lock()
			f.api.uris = nil
			f.api.mu.Unlock()
			resp, body := f.do(t, c, "PUT", "https://api.test:"+f.apiPort+p, "Bearer "+f.ph, "")
			f.api.mu.Lock()
			uris := f.api.uris
			f.api.mu.Unlock()
			if resp.StatusCode == http.StatusForbidden {
				continue // refused: nothing reached the origin with the value
			}
			want := "/repos/me/x"
			if strings.Contains(p, "?") {
				want = "/repos/me/x?b=A&a=1"
			}
			if resp.StatusCode != 200 || len(uris) != 1 || uris[0] != want {
				t.Errorf("h2 %v: PUT %s = %d %q, origin read %q; want %s, the form the binding decided", h2, p, resp.StatusCode, body, uris, want)
			}
		}
	}
}

// TestSecretPlaceholderRedactedWhateverRefused: a placeholder in the path
// of a request the host's request rules refuse (before the secrets step)
// is not in its decision line either. assertNoValue, at cleanup, searches
// every line for the placeholder.
func TestSecretPlaceholderRedactedWhateverRefused(t *testing.T) {
	f := newSecretsFixtureAllowing(t, []string{"api.test GET /v1/**", "other.test"})
	c := f.h.client(false)
	resp, _ := f.do(t, c, "GET", "https://api.test:"+f.apiPort+"/v2/"+strings.ToUpper(f.ph), "", "")
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != "path_not_allowed" {
		t.Fatalf("status %d reason %q, want 403 path_not_allowed", resp.StatusCode, resp.Header.Get("X-Abox-Reason"))
	}
	line := f.h.waitLine(t, "denial_id", resp.Header.Get("X-Abox-Denial-Id"))
	if p, _ := line["path"].(string); !strings.Contains(p, secrets.PlaceholderPrefix+"REDACTED") {
		t.Errorf("the refused request's path is logged as %q, want the placeholder redacted", p)
	}
}

func TestHasPlaceholderPrefix(t *testing.T) {
	for s, want := range map[string]bool{"/a/abox-ph-1": true, "/ABOX-PH-x": true, "abox-ph-": true, "/abox-ph": false, "/a/b": false, "": false, "Abox-pH-": true} {
		if got := hasPlaceholderPrefix(s); got != want {
			t.Errorf("hasPlaceholderPrefix(%q) = %v", s, got)
		}
	}
}

// TestSecretPlaceholderInAStreamedBody: a body Decide does not see whole
// (chunked HTTP/1.1, an HTTP/2 stream without a length, an upload longer
// than MaxSecretBodyScan) is scanned as it streams. A placeholder in it,
// even split across the guest's writes, never reaches the origin: the
// body stops before it and the request is refused secret_leak.
func TestSecretPlaceholderInAStreamedBody(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		for _, tc := range []struct {
			name   string
			length bool // send a Content-Length (a long body)
			before int  // bytes before the placeholder
			split  int  // where the guest's writes split the placeholder
		}{
			{"no length", false, 1000, 0},
			{"no length, placeholder split across writes", false, 70000, 13},
			{"no length, percent-encoded", false, 10, -1},
			{"long body, placeholder past the scanned prefix", true, MaxSecretBodyScan + 5000, 20},
		} {
			t.Run(fmt.Sprintf("h2=%v/%s", h2, tc.name), func(t *testing.T) {
				f := newSecretsFixture(t)
				c := f.h.client(h2)
				ph := f.ph
				if tc.split < 0 {
					ph = ""
					for _, ch := range []byte(f.ph) {
						ph += fmt.Sprintf("%%%02X", ch)
					}
					tc.split = 0
				}
				head := strings.Repeat("a", tc.before)
				parts := []string{head + ph[:tc.split], ph[tc.split:] + strings.Repeat("z", 100000)}
				pr, pw := io.Pipe()
				go func() {
					for _, s := range parts {
						if _, err := pw.Write([]byte(s)); err != nil {
							return
						}
					}
					pw.Close()
				}()
				req, _ := http.NewRequest("POST", "https://api.test:"+f.apiPort+"/v1/files", pr)
				if tc.length {
					req.ContentLength = int64(len(parts[0]) + len(parts[1]))
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				pr.Close()
				if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretLeak {
					t.Fatalf("status %d reason %q (%q), want 403 %s", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body, secrets.ReasonSecretLeak)
				}
				line := f.h.waitLine(t, "denial_id", resp.Header.Get("X-Abox-Denial-Id"))
				if want := "secret_leak: secret TOKEN in the body (wrong_placement)"; line["secret"] != want {
					t.Errorf("line %v: want secret %q", line, want)
				}
				f.api.mu.Lock()
				defer f.api.mu.Unlock()
				for _, b := range f.api.bodies {
					if strings.Contains(strings.ToLower(b), f.ph) || strings.Contains(b, ph) || strings.Contains(b, "zzz") {
						t.Errorf("the origin read the placeholder or what follows it (%d bytes)", len(b))
					}
				}
			})
		}
	}
}

// TestSecretPlaceholderInMethodOrTrailer: a placeholder spelled as the
// method, or sent in a trailer field after the body, is a leak like one in
// a header: refused, never read by the origin, and in no decision line.
func TestSecretPlaceholderInMethodOrTrailer(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("h2=%v", h2), func(t *testing.T) {
			f := newSecretsFixture(t)
			c := f.h.client(h2)
			other := "https://other.test:" + f.otherPort + "/x"

			resp, body := f.do(t, c, strings.ToUpper(f.ph), other, "", "")
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretLeak {
				t.Errorf("method: status %d reason %q (%q), want 403 secret_leak", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), body)
			}

			pr, pw := io.Pipe()
			req, _ := http.NewRequest("POST", other, pr)
			req.Trailer = http.Header{"X-Note": nil}
			go func() {
				pw.Write([]byte(strings.Repeat("b", 2000)))
				req.Trailer.Set("X-Note", "see "+f.ph)
				pw.Close()
			}()
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Abox-Reason") != secrets.ReasonSecretLeak {
				t.Errorf("trailer: status %d reason %q (%q), want 403 secret_leak", resp.StatusCode, resp.Header.Get("X-Abox-Reason"), b)
			} else if line := f.h.waitLine(t, "denial_id", resp.Header.Get("X-Abox-Denial-Id")); line["secret"] != "secret_leak: secret TOKEN in the trailer (wrong_placement)" {
				t.Errorf("trailer line %v", line)
			}
			f.other.mu.Lock()
			defer f.other.mu.Unlock()
			for _, b := range f.other.bodies {
				if strings.Contains(strings.ToLower(b), f.ph) {
					t.Errorf("other.test read the placeholder: %q", b)
				}
			}
		})
	}
}

// TestSecretPlaceholderRedactedInEveryField: a placeholder the guest puts
// in a host name, or percent-encodes in a path, is in no decision line
// (assertNoValue, at cleanup, searches them for the placeholder; the
// encoded form is searched here).
func TestSecretPlaceholderRedactedInEveryField(t *testing.T) {
	f := newSecretsFixture(t)
	c := f.h.client(false)
	enc := "%61" + f.ph[1:]
	resp, _ := f.do(t, c, "GET", "https://api.test:"+f.apiPort+"/v1/"+enc, "", "")
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an encoded placeholder in the path: status %d, want 403", resp.StatusCode)
	}
	line := f.h.waitLine(t, "denial_id", resp.Header.Get("X-Abox-Denial-Id"))
	if p, _ := line["path"].(string); strings.Contains(p, f.ph[len(secrets.PlaceholderPrefix):]) {
		t.Errorf("the line's path %q holds the placeholder's digits", p)
	}
	// A name no entry allows: the CONNECT is refused, and logged.
	if _, err := c.Get("https://" + f.ph + ".test:" + f.apiPort + "/"); err == nil {
		t.Errorf("a CONNECT to a name that is a placeholder went through")
	}
	f.h.waitLine(t, "reason", "not_allowlisted")
}
