package httpfilter

import (
	"net/http"
	"strings"
)

// Reason codes of the request checks that come before any decision.
const (
	// ReasonTraceRefused: TRACE and TRACK echo the request, credentials
	// included; the proxy answers them itself and never forwards them.
	ReasonTraceRefused = "trace_refused"
	// ReasonURITooLong: a request line or target longer than maxRequestLine.
	ReasonURITooLong = "uri_too_long"
	// ReasonFieldTooLarge: one header field longer than maxFieldLine.
	ReasonFieldTooLarge = "header_field_too_large"
)

// requestRefusal applies the checks every request passes before its target
// is decided, on every path (plain HTTP, CONNECT, intercepted HTTP/1 and
// HTTP/2): the method, and the size of the target and of each field. The h1
// guard enforces the sizes on the bytes already; this covers HTTP/2, whose
// requests never pass the guard.
func requestRefusal(r *http.Request) (status int, reason string) {
	switch strings.ToUpper(r.Method) {
	case "TRACE", "TRACK":
		return http.StatusMethodNotAllowed, ReasonTraceRefused
	}
	if len(r.RequestURI) > maxRequestLine || len(r.Host) > maxRequestLine {
		return http.StatusRequestURITooLong, ReasonURITooLong
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if len(k)+len(v)+2 > maxFieldLine {
				return http.StatusRequestHeaderFieldsTooLarge, ReasonFieldTooLarge
			}
		}
	}
	return 0, ""
}
