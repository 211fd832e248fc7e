package explain

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

type loopback struct{}

func (loopback) LookupNetIP(context.Context, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// TestExplainAgreesWithProxy holds explain and the proxy together: each
// request runs through a real proxy (plain HTTP, and HTTP/1.1 inside an
// intercepted tunnel) and through Explain, which must give the same
// verdict, reason and rule set.
func TestExplainAgreesWithProxy(t *testing.T) {
	const rules = `example.com GET,HEAD /repos/acme/**
example.com POST /repos/acme/app/pulls
example.com GET /search?q=x
example.com PUT /trial/** audit
`
	var cases = []struct{ method, path string }{
		{"GET", "/repos/acme/app"},
		{"HEAD", "/repos/acme/app"},
		{"POST", "/repos/acme/app/pulls"},
		{"POST", "/repos/acme/app/issues"},
		{"DELETE", "/repos/acme/app"},
		{"PATCH", "/"},
		{"get", "/repos/acme/app"},
		{"GET", "/repos/other/x"},
		{"GET", "/repos/acme/app/../../other"},
		{"GET", "/repos/acme%2fapp/../other"},
		{"GET", "/repos/acme/%2e%2e/other"},
		{"GET", "/repos//acme/./app"},
		{"GET", "/repos/%61cme/app"},
		{"GET", "/repos/acme/..;/x"},
		{"GET", "/repos/acme/a%5cb"},
		{"GET", "/repos/acme/%252e"},
		{"GET", "/search?q=x"},
		{"GET", "/search?%71=x"},
		{"GET", "/search?q=y"},
		{"GET", "/search"},
		{"PUT", "/trial/x"},
		{"PUT", "/x"},
	}
	dir := t.TempDir()
	al := filepath.Join(dir, "allowlist.txt")
	os.WriteFile(al, []byte(rules), 0o644)
	eng, err := policy.New(policy.Config{AllowlistPath: al})
	if err != nil {
		t.Fatal(err)
	}
	origin := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	origin.StartTLS()
	defer origin.Close()
	plain := httptest.NewServer(origin.Config.Handler)
	defer plain.Close()
	roots := x509.NewCertPool()
	roots.AddCert(origin.Certificate())
	tlsPort, plainPort := portOf(t, origin.URL), portOf(t, plain.URL)
	addrs := netclass.New(netclass.Options{PermitHost: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}})
	authority, err := ca.New(ca.Config{Dir: filepath.Join(dir, "ca")})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ports := []uint16{tlsPort, plainPort}
	proxy, err := httpfilter.New(httpfilter.Config{Listener: ln, Policy: eng, Resolver: loopback{}, Addresses: addrs,
		Ports: ports, CA: authority, UpstreamRoots: roots, RequestRate: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- proxy.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	pem, _ := authority.CertPEM()
	proxyRoots := x509.NewCertPool()
	proxyRoots.AppendCertsFromPEM(pem)
	pol := Policy{List: eng.List(), Mode: policy.Active, Addresses: addrs, Ports: ports}

	for _, c := range cases {
		for _, scheme := range []string{"http", "https"} {
			t.Run(scheme+" "+c.method+" "+c.path, func(t *testing.T) {
				pt := plainPort
				if scheme == "https" {
					pt = tlsPort
				}
				u := fmt.Sprintf("%s://example.com:%d%s", scheme, pt, c.path)
				status, reason, set := viaProxy(t, ln.Addr().String(), proxyRoots, scheme, pt, c.method, c.path)
				r, err := Explain(pol, c.method, u)
				if c.method == "get" {
					// explain refuses it as a typo; the proxy's answer
					// is the rules' for the method "get".
					if err == nil {
						t.Fatal("explain took get for a method")
					}
					r, err = explainAny(pol, c.method, u)
				}
				if err != nil {
					t.Fatal(err)
				}
				wantVerdict := allowlist.Allow
				if status == http.StatusForbidden {
					wantVerdict = allowlist.Block
				}
				gotSet := ""
				if r.Request != nil {
					gotSet = r.Request.Set
				}
				if r.Verdict != wantVerdict || (wantVerdict == allowlist.Block && (r.Proxy.Reason != reason || gotSet != set)) {
					t.Errorf("explain: %s %s (rules of %q), proxy: %d %s (rules of %q)", r.Verdict, r.Proxy.Reason, gotSet, status, reason, set)
				}
				if wantVerdict == allowlist.Allow && gotSet != "example.com" {
					t.Errorf("explain names rule set %q, want example.com", gotSet)
				}
			})
		}
	}
}

// explainAny is Explain without its method check: the request decision
// alone, for a method explain refuses as a typo.
func explainAny(p Policy, method, target string) (Result, error) {
	r, err := Explain(p, "GET", target)
	if err != nil {
		return r, err
	}
	d := policy.Evaluate(p.List, p.Mode, "example.com")
	r.Proxy = Step{Verdict: d.Verdict, Reason: d.Reason, Rule: d.Rule}
	r.Request = request(&r.Proxy, p.List.Rules(d.Rule), p.Mode, method, target)
	r.Verdict = r.Proxy.Verdict
	return r, nil
}

// viaProxy sends one request through the proxy, the path as written.
func viaProxy(t *testing.T, proxyAddr string, proxyRoots *x509.CertPool, scheme string, pt uint16, method, path string) (status int, reason, set string) {
	t.Helper()
	auth := "example.com:" + strconv.Itoa(int(pt))
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	target := "http://" + auth + path
	if scheme == "https" {
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", auth, auth)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		tc := tls.Client(c, &tls.Config{RootCAs: proxyRoots, ServerName: "example.com", NextProtos: []string{"http/1.1"}})
		c, br, target = tc, bufio.NewReader(tc), path
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", method, target, auth)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 && resp.StatusCode != 403 {
		t.Fatalf("%s %s: status %d", method, path, resp.StatusCode)
	}
	return resp.StatusCode, resp.Header.Get("X-Abox-Reason"), resp.Header.Get("X-Abox-Rule-Set")
}

func portOf(t *testing.T, s string) uint16 {
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(u.Port())
	return uint16(n)
}

// TestExplainRequest: the request part of explain's answer.
func TestExplainRequest(t *testing.T) {
	l := list(t, "api.github.com GET,HEAD /**\napi.github.com POST /repos/acme/app/pulls\nopen.test\n")
	p := Policy{List: l, Mode: policy.Active}
	for _, tt := range []struct {
		method, target string
		verdict        allowlist.Verdict
		reason, path   string
	}{
		{"", "https://api.github.com/repos/acme/app", allowlist.Allow, "", "/repos/acme/app"},
		{"POST", "https://api.github.com/repos/acme/app/pulls#frag", allowlist.Allow, "", "/repos/acme/app/pulls"},
		{"POST", "https://api.github.com/gists", allowlist.Block, reqrules.ReasonPathNotAllowed, ""},
		{"DELETE", "https://api.github.com/repos/acme/app", allowlist.Block, reqrules.ReasonMethodNotAllowed, ""},
		{"GET", "https://api.github.com/a/%2e%2e/b", allowlist.Allow, "", "/b"},
		{"GET", "https://api.github.com/a/..;/b", allowlist.Block, reqrules.ReasonPathNotCanonical, ""},
	} {
		r, err := Explain(p, tt.method, tt.target)
		if err != nil {
			t.Fatal(err)
		}
		if r.Verdict != tt.verdict || (tt.reason != "" && r.Proxy.Reason != tt.reason) || r.Request == nil || r.Request.Path != tt.path {
			t.Errorf("%s %s: %s %s %+v, want %s %s path %q", tt.method, tt.target, r.Verdict, r.Proxy.Reason, r.Request, tt.verdict, tt.reason, tt.path)
		}
	}
	if r, _ := Explain(p, "DELETE", "https://open.test/x"); r.Verdict != allowlist.Allow || r.Request != nil {
		t.Errorf("a host without rules: %+v", r)
	}
	if r, _ := Explain(p, "", "api.github.com"); r.Verdict != allowlist.Allow || r.Request == nil || r.Request.Decision != nil || r.Request.Note == "" {
		t.Errorf("a bare name with rules: %+v", r.Request)
	}
	for _, m := range []string{"get", "GE T", ""} {
		if m == "" {
			continue
		}
		if _, err := Explain(p, m, "https://api.github.com/"); err == nil || !strings.Contains(err.Error(), "method") {
			t.Errorf("method %q: %v, want an error naming the method", m, err)
		}
	}
}
