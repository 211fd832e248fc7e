package secrets

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/validate"
)

// How a bound secret is sent. The proxy always writes the whole header:
// whatever the guest put there is replaced.
const (
	// SendBearer sends "Authorization: Bearer <value>".
	SendBearer = "bearer"
	// SendBasic sends "Authorization: Basic base64(<user>:<value>)".
	SendBasic = "basic"
	// SendHeader sends "<Header>: <value>".
	SendHeader = "header"
)

// DefaultPort is the port a binding applies to when its host names none.
const DefaultPort = 443

// Binding says where one secret may go from one instance and how it is
// sent. It is stored as written (after normalisation); Compile checks it
// again, so a hand-edited index cannot widen a binding past validation.
type Binding struct {
	// Instance is the instance name; validate.InstanceName accepts it.
	Instance string `json:"instance"`
	// Host is an allowlist entry: an exact name or "*.domain" below a
	// registrable domain, normalised (lowercase ASCII, no trailing dot).
	Host string `json:"host"`
	// Port is the TCP port of the origin, 1-65535.
	Port uint16 `json:"port"`
	// Rules are reqrules lines ("POST /v1/**"); none means every method on
	// every path of the host.
	Rules []string `json:"rules,omitempty"`
	// Send is SendBearer, SendBasic or SendHeader.
	Send string `json:"send"`
	// Header is the canonical header name (http.CanonicalHeaderKey) the
	// value goes in: Authorization for bearer and basic.
	Header string `json:"header"`
	// User is the Basic user name; only with SendBasic, never empty there.
	User string `json:"user,omitempty"`
}

// String is a one-line summary for lists and decisions, never holding a
// value or a placeholder.
func (b Binding) String() string {
	h := b.Host
	if b.Port != DefaultPort {
		h += ":" + strconv.Itoa(int(b.Port))
	}
	s := b.Instance + " -> " + h
	if len(b.Rules) > 0 {
		s += " [" + strings.Join(b.Rules, "; ") + "]"
	}
	switch b.Send {
	case SendBearer:
		s += " as Authorization: Bearer"
	case SendBasic:
		s += " as Authorization: Basic (user " + b.User + ")"
	default:
		s += " as " + b.Header
	}
	return s
}

// BindingSpec is a binding as the user writes it, before validation.
type BindingSpec struct {
	Instance string
	Host     string   // "api.example.com", "*.example.com", "host:8443"
	Rules    []string // reqrules lines
	Bearer   bool
	Basic    string // the Basic user; set means Basic
	Header   string // a header name; set means a named header
}

// forbiddenHeaders are the headers a secret may not be sent in: the ones
// that frame the request or that the proxy owns, where a value would
// change what the request is rather than authenticate it.
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true,
	"Connection": true, "Keep-Alive": true, "Upgrade": true, "Te": true,
	"Trailer": true, "Proxy-Authorization": true, "Proxy-Connection": true,
	"Proxy-Authenticate": true, "Content-Type": true, "Expect": true,
	"Cookie": true, // several cookies share it: a whole-header replacement would drop the others
}

// tokenPattern is RFC 9110's token, which a header name is.
var tokenPattern = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")

// basicUserPattern keeps the user printable and free of ':' (which would
// end it in Basic's user:password).
var basicUserPattern = regexp.MustCompile(`^[\x21-\x39\x3b-\x7e]{1,128}$`)

// ParseBinding validates spec into a Binding. Every error names the
// problem and the fix.
func ParseBinding(spec BindingSpec) (Binding, error) {
	var errs []error
	if err := validate.InstanceName(spec.Instance); err != nil {
		errs = append(errs, fmt.Errorf("instance: %w", err))
	}
	b := Binding{Instance: spec.Instance, Port: DefaultPort}
	host, port, err := parseHost(spec.Host)
	if err != nil {
		errs = append(errs, err)
	}
	b.Host, b.Port = host, port
	for _, r := range spec.Rules {
		rule, err := reqrules.ParseRule(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("rule %q: %w (a rule is [METHOD[,METHOD...]] /path/pattern, such as 'POST /v1/**')", r, err))
			continue
		}
		if rule.Audit() {
			errs = append(errs, fmt.Errorf("rule %q: audit rules allow what they would deny, so a secret would be sent beyond its binding; drop the word audit", r))
			continue
		}
		if rule.String() == "" {
			errs = append(errs, fmt.Errorf("rule %q: an empty rule allows everything; leave --rule out instead", r))
			continue
		}
		b.Rules = append(b.Rules, rule.String())
	}
	n := 0
	if spec.Bearer {
		n++
		b.Send, b.Header = SendBearer, "Authorization"
	}
	if spec.Basic != "" {
		n++
		b.Send, b.Header, b.User = SendBasic, "Authorization", spec.Basic
		if !basicUserPattern.MatchString(spec.Basic) {
			errs = append(errs, fmt.Errorf("basic user %q: want 1-128 printable ASCII characters without ':' or spaces", spec.Basic))
		}
	}
	if spec.Header != "" {
		n++
		b.Send, b.Header = SendHeader, http.CanonicalHeaderKey(spec.Header)
		switch {
		case !tokenPattern.MatchString(spec.Header):
			errs = append(errs, fmt.Errorf("header %q: want a header name (letters, digits and -, at most 64), such as x-api-key", spec.Header))
		case strings.EqualFold(spec.Header, "Authorization"):
			errs = append(errs, fmt.Errorf("header %q: for Authorization say how the value is sent: --bearer or --basic USER", spec.Header))
		case forbiddenHeaders[b.Header]:
			errs = append(errs, fmt.Errorf("header %q: a secret cannot be sent in a header that frames the request or that the proxy owns; name the API's own header, such as x-api-key", spec.Header))
		}
	}
	switch n {
	case 0:
		errs = append(errs, errors.New("say how the secret is sent: --bearer, --basic USER or --header NAME"))
	case 1:
	default:
		errs = append(errs, errors.New("give only one of --bearer, --basic USER and --header NAME"))
	}
	if len(errs) > 0 {
		return Binding{}, errors.Join(errs...)
	}
	return b, nil
}

// parseHost reads "name", "*.name" or either with ":port".
func parseHost(s string) (string, uint16, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", 0, errors.New("host: missing; name the API host, such as --host api.example.com")
	}
	if strings.Contains(s, "://") || strings.ContainsAny(s, "/?#@") {
		return "", 0, fmt.Errorf("host %q: write a host name (and optionally :port) only, without scheme or path; restrict paths with --rule", s)
	}
	port := uint16(DefaultPort)
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		p, err := strconv.ParseUint(s[i+1:], 10, 16)
		if err != nil || p == 0 {
			return "", 0, fmt.Errorf("host %q: port %q: want a number 1-65535", s, s[i+1:])
		}
		port, s = uint16(p), s[:i]
	}
	e, err := allowlist.ParseEntry(s)
	if err != nil {
		return "", 0, fmt.Errorf("host: %w", err)
	}
	return e.String(), port, nil
}

// compiled is a Binding ready for matching.
type compiled struct {
	Binding
	secret string
	hosts  *allowlist.List // the one entry of Host
	rules  *reqrules.Set   // nil: every request to the host
}

// compile re-validates b (a stored binding may have been edited by hand)
// and builds its matchers.
func compile(secret string, b Binding) (compiled, error) {
	spec := BindingSpec{Instance: b.Instance, Host: b.Host, Rules: b.Rules}
	if b.Port != DefaultPort {
		spec.Host += ":" + strconv.Itoa(int(b.Port))
	}
	switch b.Send {
	case SendBearer:
		spec.Bearer = true
	case SendBasic:
		spec.Basic = b.User
	case SendHeader:
		spec.Header = b.Header
	}
	nb, err := ParseBinding(spec)
	if err != nil {
		return compiled{}, fmt.Errorf("secret %s: binding %s: %w", secret, b.Instance+" -> "+b.Host, err)
	}
	e, err := allowlist.ParseEntry(nb.Host)
	if err != nil {
		return compiled{}, fmt.Errorf("secret %s: binding host %s: %w", secret, nb.Host, err)
	}
	c := compiled{Binding: nb, secret: secret, hosts: allowlist.New([]allowlist.Entry{e})}
	if len(nb.Rules) > 0 {
		rules := make([]reqrules.Rule, len(nb.Rules))
		for i, r := range nb.Rules {
			rules[i] = reqrules.MustParseRule(r) // ParseBinding accepted it
		}
		c.rules = reqrules.NewSet(nb.Host, rules)
	}
	return c, nil
}

// sameTarget reports whether two bindings of one secret send it to the
// same place (they replace each other in the store).
func sameTarget(a, b Binding) bool {
	return a.Instance == b.Instance && a.Host == b.Host && a.Port == b.Port
}
