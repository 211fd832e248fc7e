package httpfilter

import (
	"net/textproto"
	"strings"
)

// routingFields are the request fields that some front end, load balancer,
// platform or framework in front of an origin reads to route the request
// to another host, port, scheme, path or handler, or to take the client
// for another one: with each, the documentation that names it. The proxy
// decided the request's host, path and method; none of these may tell the
// servers behind the origin's front end otherwise (removeRoutingFields).
var routingFields = map[string]string{
	// Another host or port.
	"Forwarded":            "RFC 7239; nginx, Envoy, Traefik, Spring, Django, Rails honour it",
	"X-Forwarded":          "legacy spelling of Forwarded (Microsoft ARR, some PHP frameworks)",
	"X-Host":               "Symfony and Zend trusted-host headers, Apache mod_rewrite setups",
	"X-Original-Host":      "Azure Application Gateway, Azure Front Door, ingress-nginx",
	"X-Http-Host-Override": "host override honoured by some PHP frameworks and CDNs",
	"X-Real-Host":          "host override of nginx setups and Varnish configurations",
	"Disguised-Host":       "Azure App Service: the host the front end received",
	"Proxy":                "httpoxy: CGI servers hand it to the application as HTTP_PROXY",
	// Another path or URL.
	"X-Original-Url":       "IIS URL Rewrite, Azure Application Gateway, Symfony (IIS rewritten URL)",
	"X-Rewrite-Url":        "IIS ISAPI_Rewrite, Symfony and Zend request URI detection",
	"X-Original-Uri":       "ingress-nginx and nginx auth_request",
	"X-Override-Url":       "URL override of some API gateways",
	"X-Waws-Unencoded-Url": "Azure App Service: the URL before decoding",
	// Another scheme (and with it the default port).
	"X-Url-Scheme":    "Gunicorn, Werkzeug (secure scheme headers)",
	"X-Scheme":        "ingress-nginx, Flask and Werkzeug proxy fixes",
	"Front-End-Https": "Microsoft ISA and Outlook Web Access front ends, Rails",
	"X-Arr-Ssl":       "Azure App Service ARR: the front end spoke TLS",
	// Another method, and with it another handler.
	"X-Http-Method-Override": "Google APIs, Express method-override, Rails, ASP.NET Web API",
	"X-Http-Method":          "OData and SAP gateways, Symfony",
	"X-Method-Override":      "Express method-override and other frameworks",
	// Another client, which origins trust for access decisions.
	"X-Real-Ip":                "nginx realip module, Traefik, Echo, Gin",
	"X-Client-Ip":              "Express request-ip, Apache mod_remoteip setups",
	"True-Client-Ip":           "Akamai, Cloudflare Enterprise",
	"Cf-Connecting-Ip":         "Cloudflare",
	"Fastly-Client-Ip":         "Fastly",
	"X-Cluster-Client-Ip":      "Rackspace and Riverbed load balancers, Rails",
	"X-Original-Forwarded-For": "ingress-nginx",
	"Client-Ip":                "Rails and PHP client IP detection",
}

// routingPrefixes are families of such fields, each under one owner who
// documents more of them than a list would keep up with.
var routingPrefixes = []struct{ prefix, source string }{
	{"X-Forwarded-", "de facto proxy headers (-Host, -Port, -Proto, -Prefix, -Uri, -Server, -For, ...): every proxy and framework"},
	{"X-Envoy-", "Envoy and Istio (x-envoy-original-path, x-envoy-original-dst-host picks the upstream host)"},
	{"X-Cf-", "Cloud Foundry gorouter (X-CF-App-Instance picks the instance, X-CF-Forwarded-Url the URL)"},
	{"Fly-", "Fly.io's proxy (Fly-Force-Instance-Id, Fly-Prefer-Region pick the machine)"},
}

// isRoutingField reports whether the canonical field name k is one that
// removeRoutingFields drops. Underscores count as hyphens: CGI, WSGI and
// PHP servers read X_Forwarded_Host as X-Forwarded-Host (both become
// HTTP_X_FORWARDED_HOST), the spelling that slips past proxies that strip
// only the hyphenated one.
func isRoutingField(k string) bool {
	if strings.IndexByte(k, '_') >= 0 {
		k = textproto.CanonicalMIMEHeaderKey(strings.ReplaceAll(k, "_", "-"))
	}
	if _, ok := routingFields[k]; ok {
		return true
	}
	for _, p := range routingPrefixes {
		if strings.HasPrefix(k, p.prefix) {
			return true
		}
	}
	return false
}
