package gitpush

import (
	"net/http"
	"net/url"
	"strings"
)

// Held reports whether a request to a host with push rules is a push the
// proxy holds: any method but a read (GET, HEAD) whose path, decoded,
// names git-receive-pack. It looks anywhere in the path and ignores case,
// so that no spelling an origin might route to receive-pack goes
// unjudged (a request it wrongly takes for a push is refused as
// unreadable, on a host whose pushes are held anyway). escapedPath is the
// path as the request-target spells it, without the query.
func Held(method, escapedPath string) bool {
	if method == http.MethodGet || method == http.MethodHead {
		return false
	}
	if d, err := url.PathUnescape(escapedPath); err == nil {
		escapedPath = d
	}
	return strings.Contains(strings.ToLower(escapedPath), "git-receive-pack")
}
