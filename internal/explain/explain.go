// Package explain answers "would the guest be allowed to reach this, by which
// rule, in which mode, with which reason code" from an instance's policy,
// without resolving the name or sending anything to the target.
package explain

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/gitpush"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// Policy is what the filters of one instance decide with.
type Policy struct {
	// List is the allowlist in force; nil allows nothing.
	List *allowlist.List
	Mode policy.Mode
	// Addresses classifies IP literals as the proxy does (permitted ranges
	// and the host's own addresses).
	Addresses *netclass.Policy
	// Ports the proxy allows; empty means the proxy's default (80, 443).
	Ports []uint16
	// NoMITM and MITMExceptions decide how an allowed CONNECT is carried.
	NoMITM         bool
	MITMExceptions []string
	// Source says where List and Mode came from, for the reader.
	Source string
}

// Step is one filter's answer.
type Step struct {
	// Verdict is allow or block; empty when the filter is not involved.
	Verdict allowlist.Verdict `json:"verdict,omitempty"`
	// Reason is the filter's stable reason code, as in its logs.
	Reason string `json:"reason,omitempty"`
	// Rule is the allowlist entry that matched, if any.
	Rule string `json:"rule,omitempty"`
	// Detail says in words what happens next.
	Detail string `json:"detail"`
}

// Result is the answer for one target.
type Result struct {
	Target string      `json:"target"`
	Scheme string      `json:"scheme"`
	Host   string      `json:"host"`
	Port   uint16      `json:"port"`
	Mode   policy.Mode `json:"mode"`
	Source string      `json:"source"`
	DNS    Step        `json:"dns"`
	Proxy  Step        `json:"proxy"`
	// Request is the request rules' answer when the entry that allowed the
	// host has rules; nil when it has none (everything on it is allowed).
	Request *Request `json:"request,omitempty"`
	// Push is the entry's push rules when it has any: a push to the host
	// is held and its refs decided by them.
	Push *Push `json:"push,omitempty"`
	// TLS says how an allowed HTTPS connection is carried.
	TLS string `json:"tls,omitempty"`
	// Verdict is the proxy's: whether the guest's request would go out.
	Verdict allowlist.Verdict `json:"verdict"`
}

// Request is the decision of the host's request rules on one request, as
// the proxy takes it (httpfilter.CheckRequest).
type Request struct {
	Method string `json:"method"`
	// Path and Query are what the proxy would send upstream: the
	// canonical form the rules decided. Empty without a URL.
	Path  string `json:"path,omitempty"`
	Query string `json:"query,omitempty"`
	// Rules lists the rule set of the entry.
	Rules string `json:"rules"`
	// Set names the entry the rules belong to.
	Set string `json:"set"`
	// Decision is the rules' decision; nil for a bare name, which is a
	// connection, not a request.
	*reqrules.Decision
	// Note says what a bare name's answer leaves open.
	Note string `json:"note,omitempty"`
}

// Push says what the push rules of the entry that allowed the host do with
// the request (gitpush.Held: the proxy's own test of what a push is).
type Push struct {
	// Rules lists the push rules; Set names their entry.
	Rules string `json:"rules"`
	Set   string `json:"set"`
	// Held is true when the request is a push: its ref updates are read
	// before anything goes upstream and decided by Rules.
	Held bool   `json:"held"`
	Note string `json:"note"`
}

// ErrTarget is returned for a target that is neither a host name, host:port,
// nor an http(s) URL.
var ErrTarget = errors.New("bad target")

// Target parses a name, host:port or http(s) URL. A bare host means HTTPS
// on port 443, what most guest traffic is.
func Target(s string) (scheme string, t egress.Target, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", t, fmt.Errorf("%w: empty (give a name such as example.com or a URL)", ErrTarget)
	}
	scheme, authority := "https", s
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", t, fmt.Errorf("%w: %v", ErrTarget, err)
		}
		scheme = strings.ToLower(u.Scheme)
		if scheme != "http" && scheme != "https" {
			return "", t, fmt.Errorf("%w: scheme %q: the guest reaches only http and https, through the proxy", ErrTarget, u.Scheme)
		}
		if u.User != nil {
			return "", t, fmt.Errorf("%w: %q holds userinfo, which the proxy refuses (%s)", ErrTarget, s, httpfilter.ReasonUserinfo)
		}
		authority = u.Host
	} else if strings.ContainsAny(s, "/?#") {
		return "", t, fmt.Errorf("%w: %q: give a name, host:port or a full URL with its scheme", ErrTarget, s)
	}
	def := uint16(443)
	if scheme == "http" {
		def = 80
	}
	t, err = egress.ParseAuthority(authority, def)
	if err != nil {
		return "", t, fmt.Errorf("%w: %v", ErrTarget, err)
	}
	return scheme, t, nil
}

// Method checks a method given to explain: any HTTP token, but a known
// method in lower case is refused, since methods are case-sensitive and
// "get" is not what the user means.
func Method(m string) error {
	if m == "" || strings.IndexFunc(m, func(r rune) bool { return r <= ' ' || r >= 0x7f || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) }) >= 0 {
		return fmt.Errorf("%w: method %q is not an HTTP method (GET, POST, ...)", ErrTarget, m)
	}
	known := []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}
	if up := strings.ToUpper(m); up != m && slices.Contains(known, up) {
		return fmt.Errorf("%w: method %q: methods are case-sensitive (the proxy's rules would not take it for %s); write %s", ErrTarget, m, up, up)
	}
	return nil
}

// Explain decides method on target as the instance's DNS filter and proxy
// would, in the proxy's order: healthcheck, the class of an IP literal, the
// allowlist and mode, the request rules of the entry that allowed the name
// (with the proxy's own function, httpfilter.CheckRequest, on the URL's
// path and query as written), the port. The addresses a name resolves to
// are checked only when the guest connects; Explain does not resolve. An
// empty method is GET.
func Explain(p Policy, method, target string) (Result, error) {
	if method == "" {
		method = http.MethodGet
	}
	if err := Method(method); err != nil {
		return Result{}, err
	}
	scheme, t, err := Target(target)
	if err != nil {
		return Result{}, err
	}
	r := Result{Target: target, Scheme: scheme, Host: t.Host(), Port: t.Port, Mode: p.Mode, Source: p.Source}
	if r.Mode == "" {
		r.Mode = policy.Active
	}
	ports := p.Ports
	if len(ports) == 0 {
		ports = []uint16{80, 443}
	}
	portOK := slices.Contains(ports, t.Port)

	if t.IsIP() {
		r.DNS = Step{Detail: "an address literal needs no lookup; the DNS filter is not involved"}
		r.Proxy = literal(p, t.Addr, r.Mode)
	} else {
		d := policy.Evaluate(p.List, r.Mode, t.Name)
		r.DNS = Step{Verdict: d.Verdict, Reason: d.Reason, Rule: d.Rule}
		r.Proxy = Step{Verdict: d.Verdict, Reason: d.Reason, Rule: d.Rule}
		switch {
		case d.Reason == policy.ReasonHealthcheck:
			r.DNS.Detail = "answered locally with 127.0.0.1; nothing is forwarded"
			r.Proxy.Detail = "answered by the proxy itself with 200; no outside connection"
		case d.Verdict == allowlist.Allow:
			r.DNS.Detail = fmt.Sprintf("forwarded to the upstream resolver; an answer holding a private or host address is blocked (%s)", dnsfilter.ReasonRebinding)
			r.Proxy.Detail = "resolved once when the guest connects; every address is classified and private, host and reserved ones are refused"
		default:
			r.DNS.Detail = "answered NXDOMAIN with an Extended DNS Error (Blocked) naming the reason"
			r.Proxy.Detail = "answered 403 with the reason in X-Abox-Reason"
		}
		if set := p.List.Rules(d.Rule); set != nil && d.Verdict == allowlist.Allow {
			r.Request = request(&r.Proxy, set, r.Mode, method, target)
		}
		if set := p.List.Push(d.Rule); set != nil && r.Proxy.Verdict == allowlist.Allow {
			r.Push = push(set, method, target)
		}
	}
	if r.Proxy.Verdict == allowlist.Allow && r.Proxy.Reason != policy.ReasonHealthcheck && !portOK {
		r.Proxy = Step{Verdict: allowlist.Block, Reason: httpfilter.ReasonPortNotAllowed, Rule: r.Proxy.Rule,
			Detail: fmt.Sprintf("port %d is not among the proxy's ports %v: answered 403 (change with `abox create --port`)", t.Port, ports)}
	}
	r.Verdict = r.Proxy.Verdict
	if r.Verdict == allowlist.Allow && scheme == "https" && r.Proxy.Reason != policy.ReasonHealthcheck {
		switch {
		case p.NoMITM:
			r.TLS = "tunnelled after checking the ClientHello's SNI (interception is off for this instance)"
		case !t.IsIP() && slices.Contains(p.MITMExceptions, t.Name):
			r.TLS = "tunnelled after checking the ClientHello's SNI (a MITM exception)"
		default:
			r.TLS = "intercepted with the instance CA: every inner request's Host is checked too"
		}
	}
	if scheme == "http" {
		r.TLS = ""
	}
	return r, nil
}

// request decides the request rules of set and, on a refusal, turns step
// (the proxy's) into it.
func request(step *Step, set *reqrules.Set, m policy.Mode, method, target string) *Request {
	rq := &Request{Method: method, Rules: set.String(), Set: set.Name()}
	if !strings.Contains(target, "://") {
		rq.Note = "every request is decided by these rules; give METHOD URL to decide one"
		return rq
	}
	// The guest never sends a fragment.
	if i := strings.IndexByte(target, '#'); i >= 0 {
		target = target[:i]
	}
	d, tg := httpfilter.CheckRequest(set, m, method, target)
	rq.Decision = &d
	if d.Allowed {
		rq.Path, rq.Query = tg.Path, tg.Query
		return rq
	}
	*step = Step{Verdict: allowlist.Block, Reason: d.Reason, Rule: step.Rule,
		Detail: fmt.Sprintf("refused by the rules of %s: answered 403 with the reason, the rule set and a denial id", set.Name())}
	return rq
}

// push says how the proxy would treat method on target under set.
func push(set *gitpush.Set, method, target string) *Push {
	p := &Push{Rules: set.String(), Set: set.Name()}
	if !strings.Contains(target, "://") {
		p.Note = "a push to this host is held: its ref updates are decided by these rules before any pack data goes upstream; give METHOD URL to see whether a request is one"
		return p
	}
	if i := strings.IndexByte(target, '#'); i >= 0 {
		target = target[:i]
	}
	path, _ := httpfilter.SplitTarget(target)
	if p.Held = gitpush.Held(method, path); p.Held {
		p.Note = "a push: held until its ref updates are read, and refused whole unless the push rules allow every one (git prints the reason)"
	} else {
		p.Note = "not a push: the push rules do not apply"
	}
	return p
}

// literal is the proxy's decision for an IP-literal target.
func literal(p Policy, a netip.Addr, m policy.Mode) Step {
	if c := p.Addresses.Check(a); !netclass.Allowed(c) {
		return Step{Verdict: allowlist.Block, Reason: string(c),
			Detail: fmt.Sprintf("the address is %s: refused in every mode (allow a range with `abox create --allow-private`)", c)}
	}
	if m != policy.Passive {
		return Step{Verdict: allowlist.Block, Reason: allowlist.ReasonNotAllowlisted,
			Detail: "allowlist entries are names, so an address literal is listed nowhere: answered 403"}
	}
	return Step{Verdict: allowlist.Allow, Reason: policy.ReasonPassive,
		Detail: "allowed and recorded because the instance is in passive mode"}
}
