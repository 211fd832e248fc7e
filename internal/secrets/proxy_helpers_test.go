package secrets

import (
	"net/url"
	"strings"
	"testing"
)

// TestBinds: the proxy holds a session's TLS keys exactly when a binding
// may inject on its host and port.
func TestBinds(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "*.example.com", Bearer: true, Rules: []string{"GET /v1/**"}})
	p, err := s.Policy("dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host string
		port uint16
		want bool
	}{
		{"api.example.com", 443, true},
		{"API.Example.com.", 443, true},
		{"example.com", 443, false},
		{"api.example.com", 8443, false},
		{"other.test", 443, false},
		{"", 443, false},
	} {
		if got := p.Binds(c.host, c.port); got != c.want {
			t.Errorf("Binds(%q, %d) = %v, want %v", c.host, c.port, got, c.want)
		}
	}
	if other, _ := s.Policy("peer"); other.Binds("api.example.com", 443) {
		t.Errorf("another instance's policy binds dev's host")
	}
}

// TestRedact: a log line never carries the instance's placeholder, in any
// case; what cannot be cut out is replaced whole.
func TestRedact(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	ph := mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	p, err := s.Policy("dev")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ in, want string }{
		{"/v1/models", "/v1/models"},
		{"/v1/" + ph, "/v1/abox-ph-REDACTED"},
		{"/a/" + strings.ToUpper(ph) + "/b/" + ph, "/a/abox-ph-REDACTED/b/abox-ph-REDACTED"},
		{"/x/abox-ph-0000/y", "/x/abox-ph-0000/y"},
		{"/x/" + url.PathEscape(ph[:4]) + "%2d" + ph[5:], "(redacted)"},
	} {
		got := p.Redact(c.in)
		if got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
		if strings.Contains(strings.ToLower(got), ph) {
			t.Errorf("Redact(%q) keeps the placeholder", c.in)
		}
	}
}
