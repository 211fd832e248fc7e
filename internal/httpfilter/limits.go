package httpfilter

import (
	"net/http"
	"strings"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// Reason codes of the request checks that come before any decision.
const (
	// ReasonTraceRefused: TRACE and TRACK echo the request, credentials
	// included; the proxy answers them itself and never forwards them.
	ReasonTraceRefused = "trace_refused"
	// ReasonURITooLong: a request line or target longer than connio.MaxRequestLine.
	ReasonURITooLong = connio.ReasonURITooLong
	// ReasonFieldTooLarge: one header field longer than connio.MaxFieldLine.
	ReasonFieldTooLarge = connio.ReasonFieldTooLarge
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
	if len(r.RequestURI) > connio.MaxRequestLine || len(r.Host) > connio.MaxRequestLine {
		return http.StatusRequestURITooLong, ReasonURITooLong
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if len(k)+len(v)+2 > connio.MaxFieldLine {
				return http.StatusRequestHeaderFieldsTooLarge, ReasonFieldTooLarge
			}
		}
	}
	return 0, ""
}
