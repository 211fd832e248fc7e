// Package h1 is the proxy's HTTP/1.x engine, written for speed: the server
// loop that reads the guest's requests and writes the answers (Server), and
// the pieces of the upstream exchange it shares with the client side (the
// header clock, the exchange watch).
//
// It parses and frames HTTP/1 and knows no policy: every request it reads
// goes to the Handler it is given, which decides. It imports no policy
// package and not httpfilter (internal/httpfilter/layering_test.go holds
// that); it may import the plumbing in internal/httpfilter/connio.
package h1

import (
	"context"
	"net/http"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// Reason codes of the refusals the server loop makes before any handler
// sees a request; internal/httpfilter re-exports them under the same names.
const (
	ReasonMalformedRequest = "malformed_request"
	ReasonHTTPVersion      = "unsupported_http_version"
	ReasonExpectation      = "unsupported_expectation"
	ReasonMissingHost      = connio.ReasonMissingHost
	ReasonMalformedHost    = connio.ReasonMalformedHost
)

// Handler serves one request of Server.Serve's. The request's own context
// is the background: ctx is the connection's (cancelled by revocation and
// shutdown, with its values), passed apart so that no copy of the request
// is made to carry it (Request.WithContext).
type Handler func(ctx context.Context, w http.ResponseWriter, r *http.Request)
