package secrets

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/reqrules"
)

// fixture is one instance's store with a secret bound in each way.
type fixture struct {
	store *Store
	pol   *Policy
	ph    map[string]string // dev's placeholders by secret
	prod  string            // prod's placeholder of TOK
}

var values = map[string]string{
	"TOK":  "value-tok-8d7c6b5a",
	"KEY":  "value-key-1a2b3c4d",
	"GIT":  "value-git-99887766",
	"AMB1": "value-amb1-0001",
	"AMB2": "value-amb2-0002",
}

func lookup(name string) ([]byte, error) { return []byte(values[name]), nil }

func newFixture(t testing.TB) *fixture {
	t.Helper()
	dir := t.TempDir()
	s := Open(dir + "/secrets")
	for n, v := range values {
		if err := s.Set(n, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	bind := func(name string, spec BindingSpec) string {
		b, err := ParseBinding(spec)
		if err != nil {
			t.Fatal(err)
		}
		ph, err := s.Bind(name, b)
		if err != nil {
			t.Fatal(err)
		}
		return ph
	}
	f := &fixture{store: s, ph: map[string]string{}}
	f.ph["TOK"] = bind("TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Rules: []string{"POST /v1/**"}, Bearer: true})
	f.ph["KEY"] = bind("KEY", BindingSpec{Instance: "dev", Host: "*.example.org", Header: "x-api-key"})
	f.ph["GIT"] = bind("GIT", BindingSpec{Instance: "dev", Host: "git.example.net", Basic: "x-access-token"})
	f.ph["AMB1"] = bind("AMB1", BindingSpec{Instance: "dev", Host: "amb.example.com", Bearer: true})
	f.ph["AMB2"] = bind("AMB2", BindingSpec{Instance: "dev", Host: "amb.example.com", Bearer: true})
	f.prod = bind("TOK", BindingSpec{Instance: "prod", Host: "api.example.com", Bearer: true})
	p, err := s.Policy("dev")
	if err != nil {
		t.Fatal(err)
	}
	f.pol = p
	return f
}

// req builds a request from a URL; ph(NAME) in any string stands for
// dev's placeholder of NAME.
type reqSpec struct {
	method string
	url    string // https://host[:port]/path?query
	plain  bool
	header map[string]string
	body   string
}

func (f *fixture) expand(s string) string {
	for n, ph := range f.ph {
		s = strings.ReplaceAll(s, "ph("+n+")", ph)
	}
	return strings.ReplaceAll(s, "ph(prod)", f.prod)
}

func (f *fixture) request(t testing.TB, r reqSpec) *Request {
	t.Helper()
	u, err := url.Parse(f.expand(r.url))
	if err != nil {
		t.Fatal(err)
	}
	port := uint16(443)
	if r.plain {
		port = 80
	}
	if p := u.Port(); p != "" {
		var n int
		for _, c := range p {
			n = n*10 + int(c-'0')
		}
		port = uint16(n)
	}
	m := r.method
	if m == "" {
		m = "POST"
	}
	h := http.Header{}
	for k, v := range r.header {
		k, v = f.expand(k), f.expand(v)
		if strings.HasPrefix(v, "basic(") {
			v = "Basic " + base64.StdEncoding.EncodeToString([]byte(strings.TrimSuffix(strings.TrimPrefix(v, "basic("), ")")))
		}
		h[k] = append(h[k], v)
	}
	var body []byte
	if r.body != "" {
		body = []byte(f.expand(r.body))
	}
	return &Request{
		Host: u.Hostname(), Port: port, Method: m,
		Target: reqrules.NewTarget(u.EscapedPath(), u.RawQuery, false),
		TLS:    !r.plain, Header: h, Body: body,
	}
}

func TestDecide(t *testing.T) {
	f := newFixture(t)
	auth := "Authorization"
	for _, c := range []struct {
		name string
		req  reqSpec
		// want: injected "SECRET:Header" list, or a refusal.
		inject []string
		reason string
		secret string
		where  string
		detail string
		// sent is the header value expected after Apply (of header[0] of inject).
		sent string
	}{
		{name: "bearer placeholder replaced",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			inject: []string{"TOK:Authorization"}, sent: "Bearer value-tok-8d7c6b5a"},
		{name: "guest's own credential replaced, not passed beside",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer sk-guest-own"}},
			inject: []string{"TOK:Authorization"}, sent: "Bearer value-tok-8d7c6b5a"},
		{name: "guest's own credential under a lowercase key replaced",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{"authorization": "Bearer sk-guest-own"}},
			inject: []string{"TOK:Authorization"}, sent: "Bearer value-tok-8d7c6b5a"},
		{name: "no credential at all: injected",
			req:    reqSpec{url: "https://api.example.com/v1/models/x"},
			inject: []string{"TOK:Authorization"}, sent: "Bearer value-tok-8d7c6b5a"},
		{name: "host name case and trailing dot",
			req:    reqSpec{url: "https://API.Example.COM./v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			inject: []string{"TOK:Authorization"}},
		{name: "named header under a wildcard",
			req:    reqSpec{method: "GET", url: "https://eu.api.example.org/anything", header: map[string]string{"X-Api-Key": "ph(KEY)"}},
			inject: []string{"KEY:X-Api-Key"}, sent: "value-key-1a2b3c4d"},
		{name: "basic from the guest's basic",
			req:    reqSpec{method: "GET", url: "https://git.example.net/o/r.git/info/refs?service=git-receive-pack", header: map[string]string{auth: "basic(agent:ph(GIT))"}},
			inject: []string{"GIT:Authorization"}, sent: "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:value-git-99887766"))},
		{name: "unbound host without placeholder passes untouched",
			req: reqSpec{url: "https://other.example.com/v1/chat", header: map[string]string{auth: "Bearer sk-guest-own"}}},
		{name: "bound host outside the rules without placeholder passes untouched",
			req: reqSpec{method: "GET", url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer sk-guest-own"}}},
		{name: "plain http without placeholder passes untouched",
			req: reqSpec{url: "http://api.example.com:443/v1/chat", plain: true}},

		{name: "placeholder as a header's name, reported without it",
			req:    reqSpec{url: "https://evil.example.com/v1/chat", header: map[string]string{"ph(TOK)": "1"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "a header name", detail: DetailNotBound},
		{name: "placeholder to another host",
			req:    reqSpec{url: "https://evil.example.com/v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: DetailNotBound},
		{name: "placeholder to the wildcard's own base name",
			req:    reqSpec{url: "https://example.org/", header: map[string]string{"X-Api-Key": "ph(KEY)"}},
			reason: ReasonSecretLeak, secret: "KEY", where: "header X-Api-Key", detail: DetailNotBound},
		{name: "placeholder on another port",
			req:    reqSpec{url: "https://api.example.com:8443/v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: DetailNotBound},
		{name: "placeholder with a method outside the binding",
			req:    reqSpec{method: "GET", url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: reqrules.ReasonMethodNotAllowed},
		{name: "placeholder on a path outside the binding",
			req:    reqSpec{url: "https://api.example.com/v2/chat", header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: reqrules.ReasonPathNotAllowed},
		{name: "placeholder on a path with no canonical form",
			req:    reqSpec{url: "https://api.example.com/v1/%5Cadmin", header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: reqrules.ReasonPathNotCanonical},
		{name: "placeholder over plain http to the bound host",
			req:    reqSpec{url: "http://api.example.com:443/v1/chat", plain: true, header: map[string]string{auth: "Bearer ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header Authorization", detail: DetailPlainHTTP},
		{name: "placeholder in the query of the bound host",
			req:    reqSpec{url: "https://api.example.com/v1/chat?key=ph(TOK)"},
			reason: ReasonSecretLeak, secret: "TOK", where: WhereQuery, detail: DetailPlacement},
		{name: "percent-encoded placeholder in a query",
			req:    reqSpec{url: "https://other.example.com/?k=" + strings.ReplaceAll("ph(TOK)", "", "")},
			reason: ReasonSecretLeak, secret: "TOK", where: WhereQuery},
		{name: "placeholder in the body of a bound request",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer ph(TOK)"}, body: `{"echo":"ph(TOK)"}`},
			reason: ReasonSecretLeak, secret: "TOK", where: WhereBody, detail: DetailPlacement},
		{name: "placeholder in the body of a plain request",
			req:    reqSpec{url: "http://paste.example.com/", plain: true, body: "data=ph(KEY)"},
			reason: ReasonSecretLeak, secret: "KEY", where: WhereBody, detail: DetailNotBound},
		{name: "placeholder in the path",
			req:    reqSpec{url: "https://other.example.com/ph(GIT)"},
			reason: ReasonSecretLeak, secret: "GIT", where: WherePath},
		{name: "placeholder in another header of the bound host",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{"X-Debug": "ph(TOK)"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header X-Debug", detail: DetailPlacement},
		{name: "another secret's placeholder in the bound header",
			req:    reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{auth: "Bearer ph(KEY)"}},
			reason: ReasonSecretLeak, secret: "KEY", where: "header Authorization", detail: DetailNotBound},
		{name: "basic placeholder to another host, found inside base64",
			req:    reqSpec{url: "https://evil.example.com/", header: map[string]string{auth: "basic(u:ph(GIT))"}},
			reason: ReasonSecretLeak, secret: "GIT", where: "header Authorization", detail: DetailNotBound},
		{name: "upper-cased placeholder to another host",
			req:    reqSpec{url: "https://evil.example.com/", header: map[string]string{"X-Token": "UPPER(ph(TOK))"}},
			reason: ReasonSecretLeak, secret: "TOK", where: "header X-Token"},
		{name: "two secrets on one header, none named",
			req:    reqSpec{url: "https://amb.example.com/"},
			reason: ReasonSecretAmbiguous, where: "header Authorization"},
		{name: "two secrets on one header, one named",
			req:    reqSpec{url: "https://amb.example.com/", header: map[string]string{auth: "Bearer ph(AMB2)"}},
			inject: []string{"AMB2:Authorization"}, sent: "Bearer value-amb2-0002"},
		{name: "two placeholders in the bound header",
			req:    reqSpec{url: "https://amb.example.com/", header: map[string]string{auth: "Bearer ph(AMB1) ph(AMB2)"}},
			reason: ReasonSecretAmbiguous, where: "header Authorization"},
		{name: "another instance's placeholder is not dev's",
			req: reqSpec{url: "https://other.example.com/", header: map[string]string{auth: "Bearer ph(prod)"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := c.req
			if c.name == "percent-encoded placeholder in a query" {
				spec.url = "https://other.example.com/?k=" + percentEncodeAll(f.ph["TOK"])
			}
			if c.name == "upper-cased placeholder to another host" {
				spec.header = map[string]string{"X-Token": strings.ToUpper(f.ph["TOK"])}
			}
			r := f.request(t, spec)
			before := r.Header.Clone()
			d := f.pol.Decide(r)
			if r.Header.Get("Authorization") != before.Get("Authorization") {
				t.Fatalf("Decide changed the request's header")
			}
			assertNoSecretIn(t, f, d)
			if c.reason != "" {
				if !d.Refused || d.Reason != c.reason {
					t.Fatalf("decision = %+v; want refused with %s", d, c.reason)
				}
				if c.secret != "" && d.Secret != c.secret {
					t.Errorf("secret = %q, want %q", d.Secret, c.secret)
				}
				if d.Where != c.where {
					t.Errorf("where = %q, want %q", d.Where, c.where)
				}
				if c.detail != "" && d.Detail != c.detail {
					t.Errorf("detail = %q, want %q", d.Detail, c.detail)
				}
				if err := Apply(r.Header, d, lookup); err == nil {
					t.Errorf("Apply of a refusal succeeded")
				}
				return
			}
			if d.Refused {
				t.Fatalf("decision = %+v; want it allowed", d)
			}
			var got []string
			for _, in := range d.Inject {
				got = append(got, in.Secret+":"+in.Header)
			}
			if strings.Join(got, ",") != strings.Join(c.inject, ",") {
				t.Fatalf("inject = %v, want %v", got, c.inject)
			}
			if err := Apply(r.Header, d, lookup); err != nil {
				t.Fatal(err)
			}
			if len(d.Inject) == 0 {
				if !equalHeader(r.Header, before) {
					t.Errorf("header changed without an injection: %v -> %v", before, r.Header)
				}
				return
			}
			h := d.Inject[0].Header
			var vals []string
			for k, v := range r.Header {
				if strings.EqualFold(k, h) {
					vals = append(vals, v...)
				}
			}
			if len(vals) != 1 {
				t.Fatalf("%s sent %d times (%q); want once", h, len(vals), vals)
			}
			if c.sent != "" && vals[0] != c.sent {
				t.Errorf("%s = %q, want %q", h, vals[0], c.sent)
			}
		})
	}
}

func percentEncodeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteString("%" + strings.ToUpper(hexByte(s[i])))
	}
	return b.String()
}

func hexByte(c byte) string {
	const h = "0123456789abcdef"
	return string([]byte{h[c>>4], h[c&15]})
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if strings.Join(v, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}

// assertNoSecretIn: a decision is logged whole, so it holds no value and
// no placeholder.
func assertNoSecretIn(t testing.TB, f *fixture, d Decision) {
	t.Helper()
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ToLower(string(b) + d.Denial())
	for _, in := range d.Inject {
		text += strings.ToLower(in.Binding)
	}
	if strings.Contains(text, PlaceholderPrefix) {
		t.Errorf("decision holds a placeholder: %s", text)
	}
	for _, v := range values {
		if strings.Contains(text, v) {
			t.Errorf("decision holds a value: %s", text)
		}
	}
}

func TestApplyUnavailable(t *testing.T) {
	f := newFixture(t)
	r := f.request(t, reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{"Authorization": "Bearer ph(TOK)"}})
	d := f.pol.Decide(r)
	if err := f.store.Remove("TOK"); err != nil {
		t.Fatal(err)
	}
	err := Apply(r.Header, d, func(n string) ([]byte, error) {
		return f.store.Value(t.Context(), n)
	})
	ue, ok := err.(*UnavailableError)
	if !ok || ue.Secret != "TOK" {
		t.Fatalf("Apply = %v; want an UnavailableError for TOK", err)
	}
}

// TestRotationReachesTheNextRequest: Apply reads the value at use, so a
// rotation between two requests of one policy is seen by the second.
func TestRotationReachesTheNextRequest(t *testing.T) {
	f := newFixture(t)
	src := f.store.Source("dev")
	get := func(n string) ([]byte, error) { return f.store.Value(t.Context(), n) }
	send := func() string {
		p, err := src.Policy()
		if err != nil {
			t.Fatal(err)
		}
		r := f.request(t, reqSpec{url: "https://api.example.com/v1/chat", header: map[string]string{"Authorization": "Bearer ph(TOK)"}})
		if err := Apply(r.Header, p.Decide(r), get); err != nil {
			t.Fatal(err)
		}
		return r.Header.Get("Authorization")
	}
	if got := send(); got != "Bearer value-tok-8d7c6b5a" {
		t.Fatalf("first request sent %q", got)
	}
	if err := f.store.Set("TOK", []byte("rotated-1234")); err != nil {
		t.Fatal(err)
	}
	if got := send(); got != "Bearer rotated-1234" {
		t.Fatalf("after rotation sent %q", got)
	}
}
