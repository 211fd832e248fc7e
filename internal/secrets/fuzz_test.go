package secrets

import (
	"encoding/base64"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/reqrules"
)

// boundTo is the oracle's own statement of the fixture's bindings: which
// requests each secret may be sent on. It does not use the package's
// matching, only the shared name normalisation and canonical path.
func boundTo(secret, host string, r *Request) bool {
	if !r.TLS || r.Port != 443 {
		return false
	}
	switch secret {
	case "TOK":
		return host == "api.example.com" && r.Method == "POST" && r.Target.PathErr == nil &&
			(r.Target.Path == "/v1" || strings.HasPrefix(r.Target.Path, "/v1/"))
	case "KEY":
		return strings.HasSuffix(host, ".example.org")
	case "GIT":
		return host == "git.example.net"
	case "AMB1", "AMB2":
		return host == "amb.example.com"
	}
	return false
}

func boundHost(host string) bool {
	return host == "api.example.com" || strings.HasSuffix(host, ".example.org") ||
		host == "git.example.net" || host == "amb.example.com"
}

// sentForms are the ways a value can appear in a header.
func sentForms(secret string) []string {
	v := values[secret]
	return []string{v, base64.StdEncoding.EncodeToString([]byte("x-access-token:" + v))}
}

// FuzzDecide states the two security claims of Decide and Apply: a value
// is never sent on a request that its binding does not cover, and a
// placeholder never reaches a bound host unreplaced.
func FuzzDecide(f *testing.F) {
	fx := newFixture(f)
	secrets := make([]string, 0, len(fx.ph))
	for n := range fx.ph {
		secrets = append(secrets, n)
	}
	sort.Strings(secrets)
	placeholders := append([]string{fx.prod}, func() []string {
		var p []string
		for _, n := range secrets {
			p = append(p, fx.ph[n])
		}
		return p
	}()...)

	f.Add("api.example.com", uint16(443), "POST", "/v1/chat", "", true, "Authorization", "Bearer ", "", uint8(5), uint8(0))
	f.Add("api.example.com", uint16(443), "POST", "/v1/chat", "a=", true, "Authorization", "Bearer x", "", uint8(5), uint8(1))
	f.Add("evil.example.com", uint16(443), "POST", "/", "", true, "X-Api-Key", "", "", uint8(3), uint8(0))
	f.Add("eu.example.org", uint16(443), "GET", "/", "", true, "x-api-key", "", "{}", uint8(3), uint8(3))
	f.Add("git.example.net", uint16(443), "GET", "/r.git/info/refs", "service=git-receive-pack", true, "authorization", "basic ", "", uint8(4), uint8(4))
	f.Add("API.example.com.", uint16(443), "POST", "/v1/%2e%2e/x", "", false, "Authorization", "Bearer ", "", uint8(5), uint8(0))
	f.Add("amb.example.com", uint16(443), "GET", "/ph", "", true, "Authorization", "", "", uint8(1), uint8(2))

	f.Fuzz(func(t *testing.T, host string, port uint16, method, path, query string, tls bool, hname, hval, body string, which, where uint8) {
		for _, s := range []string{host, method, path, query, hname, hval, body} {
			for _, v := range values {
				if strings.Contains(s, v) {
					t.Skip("the input holds a value itself")
				}
			}
		}
		ph := placeholders[int(which)%len(placeholders)]
		switch where % 6 {
		case 0:
			hval += ph
		case 1:
			query += ph
		case 2:
			path += ph
		case 3:
			body += ph
		case 4:
			hval += base64.StdEncoding.EncodeToString([]byte("u:" + ph))
		case 5: // none
		}
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		h := http.Header{}
		if hname != "" {
			h[hname] = []string{hval}
		}
		r := &Request{
			Host: host, Port: port, Method: method,
			Target: reqrules.NewTarget(path, query, false),
			TLS:    tls, Header: h, Body: []byte(body),
		}
		d := fx.pol.Decide(r)
		assertNoSecretIn(t, fx, d)
		if d.Refused {
			return
		}
		if err := Apply(r.Header, d, lookup); err != nil {
			t.Fatal(err)
		}
		norm, err := allowlist.NormalizeName(host)
		if err != nil {
			norm = ""
		}
		var sent strings.Builder
		for k, vs := range r.Header {
			sent.WriteString(k + ": " + strings.Join(vs, "\n") + "\n")
		}
		for _, s := range secrets {
			for _, form := range sentForms(s) {
				if strings.Contains(sent.String(), form) && !boundTo(s, norm, r) {
					t.Fatalf("value of %s sent to %q:%d %s %q (tls %v) outside its binding", s, host, port, method, r.Target.Path, tls)
				}
			}
		}
		if boundHost(norm) {
			all := sent.String() + "\n" + r.Target.Path + "\n" + r.Target.Query + "\n" + string(r.Body)
			for _, form := range []string{all, reqrules.PercentDecode(all)} {
				form = strings.ToLower(form)
				for _, n := range secrets {
					if strings.Contains(form, fx.ph[n]) {
						t.Fatalf("placeholder of %s reaches bound host %q unreplaced", n, host)
					}
				}
			}
		}
	})
}
