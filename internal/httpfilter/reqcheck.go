package httpfilter

import (
	"errors"
	"fmt"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// SplitTarget splits a request-target as it was on the wire (origin form
// "/p?q", absolute form "http://host/p?q", "*") into the escaped path and
// the raw query, byte for byte: what a request rule decides on. It takes
// no decoding step of its own (url.URL.EscapedPath re-encodes), so the
// bytes decided are the guest's. A fragment, which no client sends, is
// left in the path, where the normaliser refuses it.
func SplitTarget(requestTarget string) (escapedPath, rawQuery string) {
	s := requestTarget
	if i := strings.Index(s, "://"); i > 0 && !strings.HasPrefix(s, "/") {
		s = s[i+3:]
		j := strings.IndexAny(s, "/?")
		if j < 0 {
			return "", ""
		}
		s = s[j:]
	}
	p, q, _ := strings.Cut(s, "?")
	return p, q
}

// CheckRequest is the request-rule decision: the rule set of the entry
// that allowed the host (nil: everything) decides method on the
// request-target as the guest sent it (see SplitTarget). The proxy calls it
// for every plain request, inner HTTP/1.1 request, HTTP/2 stream and
// WebSocket upgrade, and abox explain for its answer, so the two cannot
// disagree. In a mode that enforces no rules (passive, learn:
// policy.Mode.EnforcesRules) a refusal is allowed and logged as
// would_deny, as those modes allow a name the list refuses: a listed host
// is held to no more than an unlisted one. The Target is what goes
// upstream.
func CheckRequest(set *reqrules.Set, mode policy.Mode, method, requestTarget string) (reqrules.Decision, reqrules.Target) {
	path, query := SplitTarget(requestTarget)
	d, t := set.Check(method, path, query)
	if !mode.EnforcesRules() && !d.Allowed {
		d.Allowed, d.WouldDeny, d.Reason = true, d.Reason, ""
	}
	return d, t
}

// Tunnelled says which hosts the proxy carries as byte tunnels, where it
// reads no request: every host with NoMITM, else the exceptions.
type Tunnelled struct {
	// All is --no-mitm.
	All bool
	// Hosts are the exceptions, as egress.Target.Host spells them.
	Hosts map[string]bool
	// exceptions lists Hosts in the order given, for errors.
	exceptions []string
}

// NewTunnelled parses --no-mitm and the MITM exceptions.
func NewTunnelled(noMITM bool, exceptions []string) (Tunnelled, error) {
	t := Tunnelled{All: noMITM, Hosts: map[string]bool{}}
	for _, h := range exceptions {
		et, err := egress.ParseHost(h)
		if err != nil {
			return Tunnelled{}, fmt.Errorf("mitm exception %q: %w", h, err)
		}
		t.Hosts[et.Host()] = true
		t.exceptions = append(t.exceptions, et.Host())
	}
	return t, nil
}

// Has reports whether a CONNECT to t is tunnelled rather than
// intercepted, leaving aside request rules (see Proxy.serveConnect).
func (t Tunnelled) Has(target egress.Target) bool {
	return t.All || t.Hosts[target.Host()]
}

// ErrRulesOnTunnel is wrapped by Check's error.
var ErrRulesOnTunnel = errors.New("request rules on a tunnelled host")

// Check refuses a list with request rules on a host the proxy tunnels: it
// could not enforce them, and the list would say it does. The policy
// engine calls it on load, reload and every edit (policy.Config.Check), so
// such a list never comes into force; the proxy, finding rules on a
// tunnelled host anyway, intercepts it.
func (t Tunnelled) Check(l *allowlist.List) error {
	var errs []error
	if t.All {
		for _, e := range l.Restricted() {
			errs = append(errs, fmt.Errorf("%w: %s has rules, but interception is off (--no-mitm, mitm.enabled: false), so the proxy cannot read its requests: drop the rules of %s or turn interception on", ErrRulesOnTunnel, e, e))
		}
		return errors.Join(errs...)
	}
	for _, h := range t.exceptions {
		n, err := allowlist.NormalizeName(h)
		if err != nil {
			continue // an address literal: no entry names it
		}
		d := l.MatchNormalized(n)
		if d.Verdict == allowlist.Allow && (l.Rules(d.Rule) != nil || l.Push(d.Rule) != nil) {
			errs = append(errs, fmt.Errorf("%w: %s has rules, but %s is a MITM exception, tunnelled unread: drop the rules of %s or the exception (--mitm-exception, mitm.exceptions)", ErrRulesOnTunnel, d.Rule, h, d.Rule))
		}
	}
	return errors.Join(errs...)
}
