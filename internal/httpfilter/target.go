package httpfilter

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/abox-dev/abox/internal/egress"
)

// innerTargetError says why the request-target of a request inside a
// tunnel is not one the proxy forwards. RFC 9112 3.2 allows origin form
// ("/path?q"), "*" for OPTIONS, and absolute form, whose authority the
// caller then checks against the tunnel's target like the Host field. Any
// other shape is refused: http.ReadRequest reads "http:https://evil.test/"
// as a URL whose host is empty and whose opaque part names another host,
// which a front end that takes the authority of an absolute-form target
// over the Host field (RFC 9112 3.2.2) would route by.
func innerTargetError(r *http.Request) error {
	u := r.URL
	bad := func(why string) error {
		return fmt.Errorf("%w: request-target %q %s", egress.ErrInvalidTarget, r.RequestURI, why)
	}
	switch {
	case u == nil:
		return bad("is missing")
	case u.Opaque != "":
		return bad("is an opaque URI, not a path or an absolute http(s) URL")
	case u.User != nil:
		return bad("carries user information")
	case r.RequestURI == "*" || u.Path == "*":
		if r.Method != http.MethodOptions || u.Scheme != "" || u.Host != "" {
			return bad(`is "*", which only OPTIONS may use`)
		}
		return nil
	case u.Scheme == "" && u.Host == "":
		if len(r.RequestURI) == 0 || r.RequestURI[0] != '/' {
			return bad("does not start with /")
		}
		return nil
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("is not an http or https URL")
	case u.Host == "":
		return bad("names no host")
	case u.Host != r.Host:
		// HTTP/2: :path in absolute form naming another authority
		// than :authority. HTTP/1's absolute form sets Host to it.
		return bad("names another authority than the Host field")
	}
	return nil
}

// upstreamURL sets u to the target sent upstream: the checked scheme and
// authority and the guest's path and query, never the guest's URL as it
// parsed (an opaque part or user information would go along).
func upstreamURL(u, guest *url.URL, scheme, authority string) {
	*u = url.URL{Scheme: scheme, Host: authority}
	if guest != nil {
		u.Path, u.RawPath, u.RawQuery, u.ForceQuery = guest.Path, guest.RawPath, guest.RawQuery, guest.ForceQuery
	}
}

// requestAuthority is the authority r names as the guest spelled it: the
// CONNECT target, the authority of an absolute-form target, or the Host
// field (HTTP/1 origin form; :authority on HTTP/2). net/url has already
// percent-decoded r.URL.Host and the r.Host it copies from it, and
// egress.ParseAuthority decodes once more: "allowed%252etest" would pass
// as allowed.test. Decoding exactly once is ParseAuthority's.
func requestAuthority(r *http.Request) string {
	ru := r.RequestURI
	if r.Method == http.MethodConnect {
		if ru != "" && ru[0] != '/' {
			return ru
		}
		return r.Host
	}
	if r.URL == nil || r.URL.Host == "" || r.URL.Opaque != "" {
		return r.Host // origin form: the Host field as sent
	}
	// Absolute form: scheme "://" authority [path-abempty] [?query].
	i := strings.Index(ru, "://")
	if i < 0 {
		return r.Host // HTTP/2: :path in origin form, :authority in Host
	}
	a := ru[i+3:]
	if j := strings.IndexAny(a, "/?#"); j >= 0 {
		a = a[:j]
	}
	return a
}
