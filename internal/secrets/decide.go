package secrets

import (
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/reqrules"
)

// Reason codes of a refusal. They are stable: the proxy's 403, its
// decision log and denial ids carry them verbatim.
const (
	// ReasonSecretLeak: a placeholder was seen on a request, or in a part of
	// a request, that its binding does not cover.
	ReasonSecretLeak = "secret_leak"
	// ReasonSecretAmbiguous: several secrets are bound to the same header
	// of the request and it names none of them with its placeholder.
	ReasonSecretAmbiguous = "secret_ambiguous"
	// ReasonSecretUnavailable: the request matched a binding but the value
	// could not be read (Apply's error); it is refused rather than sent
	// without the credential or with the guest's.
	ReasonSecretUnavailable = "secret_unavailable"
)

// Places a placeholder can be seen (Decision.Where).
const (
	WherePath  = "path"
	WhereQuery = "query"
	WhereBody  = "body"
	// WhereMethod: a placeholder spelled as the request's method.
	WhereMethod = "method"
	// WhereTrailer: a placeholder in a trailer field of the body.
	WhereTrailer = "trailer"
	// A header is "header " + its canonical name.
	whereHeader = "header "
	// whereHeaderName is a placeholder found as a header's name.
	whereHeaderName = "a header name"
)

// Why a binding does not cover a request (Decision.Detail).
const (
	DetailNotBound  = "not_bound_here"  // the secret has no binding of this host and port
	DetailPlainHTTP = "plain_http"      // bound host, but abox did not terminate TLS
	DetailPlacement = "wrong_placement" // bound request, but not in the bound header
	// A rules refusal is reqrules' reason code (method_not_allowed, ...).
)

// Policy is one instance's bindings and placeholders at one moment. It is
// immutable and safe for concurrent use.
type Policy struct {
	instance string
	bindings []compiled
	// secretOf maps a placeholder to its secret's name.
	secretOf map[string]string
}

// Instance names the policy's instance.
func (p *Policy) Instance() string { return p.instance }

// Empty reports whether the instance has no bound secret; the proxy may
// skip Decide for it.
func (p *Policy) Empty() bool { return p == nil || len(p.secretOf) == 0 }

// policyFrom builds instance's policy from an index. A binding that no
// longer validates is left out (its secret is never injected) and named
// in the error; its placeholder is kept, so a leak is still caught.
func policyFrom(instance string, ix *index) (*Policy, error) {
	p := &Policy{instance: instance, secretOf: map[string]string{}}
	names := make([]string, 0, len(ix.Secrets))
	for n := range ix.Secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, name := range names {
		e := ix.Secrets[name]
		if ph := e.Placeholders[instance]; ph != "" {
			p.secretOf[strings.ToLower(ph)] = name
		}
		for _, b := range e.Bindings {
			if b.Instance != instance {
				continue
			}
			c, err := compile(name, b)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.bindings = append(p.bindings, c)
		}
	}
	return p, errors.Join(errs...)
}

// Request is what Decide sees of one request, after every other check of
// the proxy passed (allowlist, request rules, egress).
type Request struct {
	// Host is the origin's host name as the proxy decided on it (the
	// CONNECT or SNI name, equal to the Host header), without port.
	Host string
	// Port is the origin's TCP port.
	Port uint16
	// Method is the request's method.
	Method string
	// Target is the path and query as reqrules made them (reqrules.Set.Check
	// or reqrules.NewTarget) and as they are sent upstream.
	Target reqrules.Target
	// TLS is true only for a request inside a TLS session abox terminated
	// (MITM) and re-originates with a verified upstream certificate; false
	// for plain HTTP and for tunnels abox does not open.
	TLS bool
	// Header is the request's header as it will be sent, before Apply.
	// Decide only reads it.
	Header http.Header
	// Body is a bounded prefix of the body when the proxy read one, nil
	// otherwise; a placeholder past it is not seen.
	Body []byte
}

// Injection is one header the proxy sets from a secret's value.
type Injection struct {
	// Secret is the secret's name.
	Secret string `json:"secret"`
	// Header is the canonical header name; every value the guest sent in
	// it (under any spelling of the name) is dropped.
	Header string `json:"header"`
	// Send is SendBearer, SendBasic or SendHeader; User is Basic's user.
	Send string `json:"send"`
	User string `json:"-"`
	// Binding summarises the binding that matched (Binding.String).
	Binding string `json:"binding"`
}

// Decision is the secrets verdict on one request. It never holds a value
// or a placeholder, so it can be logged whole.
type Decision struct {
	// Refused is the verdict; Reason its code (ReasonSecretLeak, ...).
	Refused bool   `json:"refused,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Secret names the secret a refusal is about.
	Secret string `json:"secret,omitempty"`
	// Where is the part of the request the placeholder was in: "path",
	// "query", "body" or "header NAME".
	Where string `json:"where,omitempty"`
	// Detail says why the binding does not cover it: a Detail* constant
	// or a reqrules reason code.
	Detail string `json:"detail,omitempty"`
	// Inject lists the headers to set when not Refused (none: the request
	// goes as it is).
	Inject []Injection `json:"inject,omitempty"`
}

// Secrets names the secrets the decision injects, for the decision log
// and for Store.MarkUsed.
func (d Decision) Secrets() []string {
	var s []string
	for _, in := range d.Inject {
		s = append(s, in.Secret)
	}
	return s
}

// found is one placeholder seen in a request.
type found struct {
	secret string
	where  string
}

// Decide is the secrets decision for one request of p's instance. It is
// pure: it reads no value and changes nothing.
//
// A request that matches one of a secret's bindings (host and port,
// intercepted TLS, its rules) has the bound header replaced by the value,
// whether the guest put the placeholder there, its own credential or
// nothing. Any placeholder of the instance anywhere else in a request
// (another host, a path outside the rules, plain HTTP, the path, the
// query, the body, another header) refuses the request with
// ReasonSecretLeak; it is never replaced there.
func (p *Policy) Decide(r *Request) Decision {
	if p == nil {
		return Decision{}
	}
	host, err := allowlist.NormalizeName(r.Host)
	if err != nil {
		host = "" // matches no binding
	}
	// The bindings this request satisfies, grouped by header.
	matched := map[string][]*compiled{}
	var headers []string
	for i := range p.bindings {
		b := &p.bindings[i]
		if p.covers(b, host, r) != "" {
			continue
		}
		if matched[b.Header] == nil {
			headers = append(headers, b.Header)
		}
		matched[b.Header] = append(matched[b.Header], b)
	}
	seen := p.scan(r)
	var d Decision
	for _, h := range headers {
		bs := matched[h]
		var named []string // secrets whose placeholder is in h
		for _, f := range seen {
			if f.where == whereHeader+h && !slices.Contains(named, f.secret) {
				named = append(named, f.secret)
			}
		}
		var pick *compiled
		switch {
		case len(named) == 1:
			i := slices.IndexFunc(bs, func(b *compiled) bool { return b.secret == named[0] })
			if i < 0 {
				return p.leak(found{named[0], whereHeader + h}, host, r)
			}
			pick = bs[i]
		case len(named) > 1:
			return Decision{Refused: true, Reason: ReasonSecretAmbiguous, Secret: strings.Join(named, ","), Where: whereHeader + h}
		default:
			pick = bs[0]
			for _, b := range bs[1:] {
				if b.secret != pick.secret {
					return Decision{Refused: true, Reason: ReasonSecretAmbiguous, Secret: pick.secret + "," + b.secret, Where: whereHeader + h}
				}
			}
		}
		d.Inject = append(d.Inject, Injection{Secret: pick.secret, Header: h, Send: pick.Send, User: pick.User, Binding: pick.String()})
	}
	// Every placeholder not in a header being replaced is a leak.
	for _, f := range seen {
		if slices.ContainsFunc(d.Inject, func(in Injection) bool { return f.where == whereHeader+in.Header }) {
			continue
		}
		return p.leak(f, host, r)
	}
	return d
}

// Binds reports whether a binding of the policy may inject on a request
// to host and port (leaving aside its rules): the proxy holds the TLS keys
// of such a session until it knows whether it carried a value.
func (p *Policy) Binds(host string, port uint16) bool {
	if p == nil {
		return false
	}
	n, err := allowlist.NormalizeName(host)
	if err != nil {
		return false
	}
	for i := range p.bindings {
		b := &p.bindings[i]
		if b.Port == port && b.hosts.MatchNormalized(n).Verdict == allowlist.Allow {
			return true
		}
	}
	return false
}

// Redact returns s with the instance's placeholders in it replaced by
// "abox-ph-REDACTED", or "(redacted)" when one is there only in a form
// (percent-encoded) that cannot be cut out, for a log line.
func (p *Policy) Redact(s string) string {
	if p.Empty() || len(p.placeholdersIn(s)) == 0 {
		return s
	}
	low := strings.ToLower(s)
	var b strings.Builder
	for {
		i := strings.Index(low, PlaceholderPrefix)
		if i < 0 {
			b.WriteString(s)
			break
		}
		end := min(i+placeholderLen, len(low))
		if p.secretOf[low[i:end]] == "" {
			b.WriteString(s[:i+len(PlaceholderPrefix)])
			s, low = s[i+len(PlaceholderPrefix):], low[i+len(PlaceholderPrefix):]
			continue
		}
		b.WriteString(s[:i] + PlaceholderPrefix + "REDACTED")
		s, low = s[end:], low[end:]
	}
	if out := b.String(); len(p.placeholdersIn(out)) == 0 {
		return out
	}
	return "(redacted)"
}

// covers returns "" when binding b covers the request, else why not (a
// Detail* constant or a reqrules reason code).
func (p *Policy) covers(b *compiled, host string, r *Request) string {
	if host == "" || b.Port != r.Port || b.hosts.MatchNormalized(host).Verdict != allowlist.Allow {
		return DetailNotBound
	}
	if !r.TLS {
		return DetailPlainHTTP
	}
	if b.rules != nil {
		if rd := b.rules.Decide(r.Method, r.Target); !rd.Allowed || rd.WouldDeny != "" {
			if rd.Reason != "" {
				return rd.Reason
			}
			return rd.WouldDeny
		}
	}
	return ""
}

// leak is the refusal for placeholder f: Detail is why the secret's
// binding closest to the request does not cover it.
func (p *Policy) leak(f found, host string, r *Request) Decision {
	detail := DetailNotBound
	for i := range p.bindings {
		b := &p.bindings[i]
		if b.secret != f.secret {
			continue
		}
		switch why := p.covers(b, host, r); why {
		case DetailNotBound:
		case "":
			detail = DetailPlacement
		default:
			if detail == DetailNotBound {
				detail = why
			}
		}
		if detail == DetailPlacement {
			break
		}
	}
	return Decision{Refused: true, Reason: ReasonSecretLeak, Secret: f.secret, Where: f.where, Detail: detail}
}

// scan finds the instance's placeholders in every part of r: raw, with
// percent-encoding undone, and inside Basic credentials. It is a best
// effort against a guest hiding one (a placeholder is useless off its
// binding anyway): what it guarantees is that a placeholder in plain
// sight is never sent anywhere but replaced in its bound header.
func (p *Policy) scan(r *Request) []found {
	var out []found
	add := func(where, s string) {
		for _, ph := range p.placeholdersIn(s) {
			out = append(out, found{p.secretOf[ph], where})
		}
	}
	add(WhereMethod, r.Method)
	add(WherePath, r.Target.Path)
	add(WhereQuery, r.Target.Query)
	if len(r.Body) > 0 {
		add(WhereBody, string(r.Body))
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		where := whereHeader + http.CanonicalHeaderKey(k)
		// A placeholder as the name itself is reported without the
		// name: a Decision is logged whole and names no placeholder.
		add(whereHeaderName, k)
		for _, v := range r.Header[k] {
			add(where, v)
			if scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok && strings.EqualFold(scheme, "basic") {
				if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil {
					add(where, string(dec))
				}
			}
		}
	}
	return out
}

// placeholdersIn returns the instance's placeholders in s, in any case
// and percent-encoded or not.
func (p *Policy) placeholdersIn(s string) []string {
	if len(p.secretOf) == 0 {
		return nil
	}
	var out []string
	for _, form := range []string{s, reqrules.PercentDecode(s)} {
		low := strings.ToLower(form)
		for i := strings.Index(low, PlaceholderPrefix); i >= 0; {
			if ph := low[i:min(i+placeholderLen, len(low))]; p.secretOf[ph] != "" && !slices.Contains(out, ph) {
				out = append(out, ph)
			}
			j := strings.Index(low[i+1:], PlaceholderPrefix)
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
	return out
}

// placeholderLen is the length of a placeholder newPlaceholder makes.
const placeholderLen = len(PlaceholderPrefix) + 32

// PlaceholderSpan is the most bytes a placeholder can take in a request:
// every byte percent-encoded. A stream scanned for placeholders holds
// back PlaceholderSpan-1 bytes until it knows they start none.
const PlaceholderSpan = 3 * placeholderLen

// SecretIn names the secret of the first of the instance's placeholders in
// b (in any case, percent-encoded or not), or "" when b holds none.
func (p *Policy) SecretIn(b []byte) string {
	if p.Empty() || len(p.secretOf) == 0 {
		return ""
	}
	if phs := p.placeholdersIn(string(b)); len(phs) > 0 {
		return p.secretOf[phs[0]]
	}
	return ""
}

// HeaderValue is the header value that sends value as in.
func (in Injection) HeaderValue(value []byte) string {
	switch in.Send {
	case SendBearer:
		return "Bearer " + string(value)
	case SendBasic:
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(in.User+":"+string(value)))
	}
	return string(value)
}

// UnavailableError is Apply's error: a value could not be read. It names
// the secret; Err never holds the value (Store.Value's errors do not).
type UnavailableError struct {
	Secret string
	Err    error
}

func (e *UnavailableError) Error() string {
	return "injecting secret " + e.Secret + ": " + e.Err.Error()
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// Apply sets d's injections in h, reading each value with value (such as
// Store.Value) at this moment: the guest's values of each header, under
// any spelling of its name, are dropped first. On error h may be partly
// changed, and the request must be refused (ReasonSecretUnavailable).
func Apply(h http.Header, d Decision, value func(secret string) ([]byte, error)) error {
	if d.Refused {
		return errors.New("applying a refused secrets decision")
	}
	for _, in := range d.Inject {
		v, err := value(in.Secret)
		if err != nil {
			return &UnavailableError{Secret: in.Secret, Err: err}
		}
		for k := range h {
			if strings.EqualFold(k, in.Header) {
				delete(h, k)
			}
		}
		h[in.Header] = []string{in.HeaderValue(v)}
	}
	return nil
}

// Denial is the short text of a refusal for the proxy's 403 body: the
// reason, the secret's name and where, never a value or placeholder.
func (d Decision) Denial() string {
	if !d.Refused {
		return ""
	}
	s := d.Reason + ": secret " + d.Secret
	if d.Where != "" {
		s += " in the " + d.Where
	}
	if d.Detail != "" {
		s += " (" + d.Detail + ")"
	}
	return s
}
