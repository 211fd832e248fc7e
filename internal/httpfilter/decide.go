package httpfilter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
)

// decision is the outcome of the one decision path every request, CONNECT
// and intercepted request goes through.
type decision struct {
	verdict allowlist.Verdict
	reason  string
	rule    string
	// status answers a refusal: 403 for policy, 400 for bad input, 502 when
	// the name cannot be resolved.
	status int
	// shown, when set, is the reason the guest is told instead of reason
	// (which the log keeps): policy.ReasonForbiddenAddress.
	shown       string
	healthcheck bool
	// checked is set when verdict is Allow and the target is not the
	// healthcheck: the only addresses that may be dialled.
	checked *egress.Checked
	err     error // for the log only
	// rules is the rule set of the entry that allowed the host (nil: no
	// rules, everything); a CONNECT to a host with rules is intercepted.
	rules *reqrules.Set
	// req is the request-rule decision when rules decided a request, and
	// target the path and query to send upstream in its canonical form.
	req    reqrules.Decision
	target reqrules.Target
	// canonical: target is sent in its canonical form although the host
	// has no rules (a secret's binding decided on it; see applySecrets).
	canonical bool
	// list and mode are the policy the name and rules were decided with.
	list *allowlist.List
	mode policy.Mode
}

// request is what the request rules look at; decide takes nil for a
// CONNECT, whose requests are decided one by one inside the tunnel.
type request struct {
	method string
	// target is the request-target as it was on the wire (r.RequestURI,
	// :path on HTTP/2): the bytes decided are the guest's.
	target string
	// list and mode, once decided, are the policy that allowed it: a use
	// held under the same one needs no second decision (useAllowed).
	list *allowlist.List
	mode policy.Mode
}

func block(status int, reason string) decision {
	return decision{verdict: allowlist.Block, reason: reason, status: status}
}

// decide: healthcheck, then (for IP literals) the address class, then the
// allowlist, the request rules of the entry that allowed the name (for rq,
// see CheckRequest), the port policy, one resolution and the class of every
// address.
// pinned, when it checked the same target (the CONNECT of the tunnel an
// inner request arrived in), stands in for the resolution: its addresses
// are classified again, and the name is decided again as for any request.
func (p *Proxy) decide(ctx context.Context, t egress.Target, pinned *egress.Checked, rq *request) decision {
	if t.Name == policy.HealthcheckName {
		return decision{verdict: allowlist.Allow, reason: policy.ReasonHealthcheck, healthcheck: true}
	}
	var d decision
	if t.IsIP() {
		// A literal needs no lookup: its class is the most precise reason.
		if c := p.cfg.Addresses.Check(t.Addr); !netclass.Allowed(c) {
			return block(http.StatusForbidden, string(c))
		}
		// Allowlist entries are names, so a literal is listed nowhere.
		if p.cfg.Policy.Mode() != policy.Passive {
			return block(http.StatusForbidden, allowlist.ReasonNotAllowlisted)
		}
		d = decision{verdict: allowlist.Allow, reason: policy.ReasonPassive}
	} else {
		ad, rules, l, mode := p.decideName(t.Name)
		if ad.Verdict != allowlist.Allow {
			d := block(http.StatusForbidden, ad.Reason)
			d.rule = ad.Rule
			return d
		}
		d = decision{verdict: allowlist.Allow, reason: ad.Reason, rule: ad.Rule, rules: rules, list: l, mode: mode}
		if rules != nil && rq != nil {
			d.req, d.target = CheckRequest(rules, mode, rq.method, rq.target)
			if !d.req.Allowed {
				rd := block(http.StatusForbidden, d.req.Reason)
				rd.rule, rd.rules, rd.req = ad.Rule, rules, d.req
				return rd
			}
		}
	}
	if !p.ports[t.Port] {
		return block(http.StatusForbidden, ReasonPortNotAllowed)
	}
	var checked *egress.Checked
	var ref *egress.Refusal
	if pinned != nil && pinned.Target.Same(t) {
		checked, ref = p.guard.Recheck(pinned)
	} else {
		checked, ref = p.guard.Check(ctx, t)
	}
	if ref != nil {
		status := http.StatusForbidden
		if ref.Class == "" && ref.Reason != allowlist.ReasonSpecialUseAlias {
			status = http.StatusBadGateway // the name did not resolve
		}
		rd := block(status, ref.Reason)
		rd.rule = d.rule
		rd.err = ref
		if status == http.StatusForbidden {
			// A name resolving somewhere forbidden: the guest learns
			// neither that it exists internally nor where it points.
			rd.shown = policy.ReasonForbiddenAddress
		}
		return rd
	}
	d.checked = checked
	return d
}

// decideName is the name decision with the rule set of the entry that
// took it, both from one list: a reload between the two would pair a name
// with another list's rules (an entry just removed has none: everything).
func (p *Proxy) decideName(n string) (ad allowlist.Decision, rules *reqrules.Set, l *allowlist.List, mode policy.Mode) {
	for {
		l = p.cfg.Policy.List()
		ad = p.cfg.Policy.DecideNormalized(n)
		mode = p.cfg.Policy.Mode()
		if p.cfg.Policy.List() == l {
			if ad.Verdict == allowlist.Allow && ad.Rule != "" {
				rules = l.Rules(ad.Rule)
			}
			return ad, rules, l, mode
		}
	}
}

func newDenialID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// record is one decision-log line.
type record struct {
	start    time.Time
	kind     string // http, connect, inner
	client   string
	method   string
	host     string
	port     uint16
	path     string
	status   int
	verdict  allowlist.Verdict
	reason   string
	shown    string // the reason the guest is told, when not reason
	rule     string
	denialID string
	mode     string // connect: mitm, tunnel, healthcheck
	connect  string // inner: the tunnel's CONNECT authority
	asked    string // the host the client asked for, when it differs (fronting)
	sni      string
	// The request rules' part (docs/policy.md): ruleSet names the entry
	// whose rules decided the request, reqRule the rule that allowed it,
	// wouldDeny the reason the other rules refuse a request only an audit
	// rule (or passive mode) allowed, detail why a path has no canonical
	// form.
	ruleSet, reqRule, wouldDeny, detail string
	up, down                            int64
	err                                 error
	// secret is a secrets refusal (secrets.Decision.Denial: reason, the
	// secret's name, where, why); injected names the secrets set on the
	// request. Never a value or a placeholder.
	secret, injected string
	// bodyLeak is set by a bodyScan that stopped the body at a
	// placeholder (its goroutine may be an upload relay's): the secret
	// field's text for the refusal.
	bodyLeak atomic.Pointer[string]
}

func (r *record) apply(d decision) {
	r.verdict, r.reason, r.rule, r.shown = d.verdict, d.reason, d.rule, d.shown
	if d.req.Set != "" {
		r.ruleSet, r.wouldDeny, r.detail = d.req.Set, d.req.WouldDeny, d.req.Detail
		r.reqRule = d.req.Rule
		if r.reqRule == "" && d.req.Allowed {
			r.reqRule = "(everything)" // the rule without methods or pattern
		}
	}
	if d.err != nil {
		r.err = d.err
	}
}

func (r *record) setTarget(t egress.Target) {
	r.host, r.port = t.Host(), t.Port
}

// clientAddr is the address of a client's host:port (the zero Addr if
// it has none): budgets are per guest, whose port changes with every
// connection.
func clientAddr(hostport string) netip.Addr {
	ap, _ := netip.ParseAddrPort(hostport)
	return ap.Addr()
}

// finish writes the log line and counts the outcome.
func (p *Proxy) finish(r *record) {
	p.redactRecord(r)
	p.cfg.Metrics.observe(r)
	p.cfg.Policy.Observe(policy.Observation{Kind: r.kind, Host: r.host, Port: r.port, Method: r.method, Path: r.path, Status: r.status, Allowed: r.verdict == allowlist.Allow, Reason: r.reason, Tunnel: r.mode == "tunnel"})
	p.stats.requests.Add(1)
	switch {
	case r.verdict == allowlist.Allow && r.reason == policy.ReasonHealthcheck:
		p.stats.healthchecks.Add(1)
		p.stats.allowed.Add(1)
	case r.verdict == allowlist.Allow:
		p.stats.allowed.Add(1)
	default:
		p.countBlock(r.reason)
	}
	if r.status == http.StatusBadGateway || r.status == http.StatusGatewayTimeout {
		p.stats.upstreamErrors.Add(1)
	}
	if p.lines != nil {
		if r.verdict == allowlist.Block {
			// A guest looping on a refused request is aggregated per
			// client address (its port changes with every connection).
			p.lines.EmitRefusal(clientAddr(r.client), r.reason, r.line(time.Now()))
			return
		}
		if r.reason == policy.ReasonHealthcheck {
			// Answered here, reaching nothing: held to a small budget
			// per client, so that a guest cannot rotate the lines of
			// what it did reach out of the log with them.
			p.lines.EmitLocal(clientAddr(r.client), r.reason, r.line(time.Now()))
			return
		}
		// Not in the refusal stream: the guest's allowed traffic, as fast
		// as its rate limit, must not rotate a refusal away.
		p.lines.EmitAllowed(r.line(time.Now()))
		return
	}
	if !p.dlog.Enabled(context.Background(), slog.LevelInfo) {
		return
	}
	attrs := make([]slog.Attr, 0, 20)
	attrs = append(attrs,
		slog.String("kind", r.kind),
		slog.String("client", r.client),
		slog.String("method", r.method),
		slog.String("host", r.host),
		slog.Int("port", int(r.port)),
		slog.String("path", r.path),
		slog.Int("status", r.status),
		slog.Int64("bytes_up", r.up),
		slog.Int64("bytes_down", r.down),
		slog.Float64("duration_ms", float64(time.Since(r.start).Microseconds())/1000),
		slog.String("verdict", string(r.verdict)),
		slog.String("reason", r.reason),
	)
	if r.rule != "" {
		attrs = append(attrs, slog.String("rule", r.rule))
	}
	if r.ruleSet != "" {
		attrs = append(attrs, slog.String("rule_set", r.ruleSet))
	}
	if r.reqRule != "" {
		attrs = append(attrs, slog.String("request_rule", r.reqRule))
	}
	if r.wouldDeny != "" {
		attrs = append(attrs, slog.String("would_deny", r.wouldDeny))
	}
	if r.detail != "" {
		attrs = append(attrs, slog.String("detail", r.detail))
	}
	if r.denialID != "" {
		attrs = append(attrs, slog.String("denial_id", r.denialID))
	}
	if r.mode != "" {
		attrs = append(attrs, slog.String("mode", r.mode))
	}
	if r.connect != "" {
		attrs = append(attrs, slog.String("connect", r.connect))
	}
	if r.asked != "" {
		attrs = append(attrs, slog.String("asked_host", r.asked))
	}
	if r.sni != "" {
		attrs = append(attrs, slog.String("sni", r.sni))
	}
	if r.secret != "" {
		attrs = append(attrs, slog.String("secret", r.secret))
	}
	if r.injected != "" {
		attrs = append(attrs, slog.String("injected", r.injected))
	}
	if r.err != nil {
		attrs = append(attrs, slog.String("error", r.err.Error()))
	}
	p.dlog.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// line encodes r as the decision line finish writes through slog: the same
// fields, in the same order, with the same encoding (see docs/http.md), but
// without reflection or per-field allocation.
func (r *record) line(now time.Time) *decisionlog.Line {
	l := decisionlog.NewLine(now, slog.LevelInfo, "request")
	l.String("kind", r.kind).
		String("client", r.client).
		String("method", r.method).
		String("host", r.host).
		Int("port", int64(r.port)).
		String("path", r.path).
		Int("status", int64(r.status)).
		Int("bytes_up", r.up).
		Int("bytes_down", r.down).
		Float("duration_ms", float64(now.Sub(r.start).Microseconds())/1000).
		String("verdict", string(r.verdict)).
		String("reason", r.reason)
	if r.rule != "" {
		l.String("rule", r.rule)
	}
	if r.ruleSet != "" {
		l.String("rule_set", r.ruleSet)
	}
	if r.reqRule != "" {
		l.String("request_rule", r.reqRule)
	}
	if r.wouldDeny != "" {
		l.String("would_deny", r.wouldDeny)
	}
	if r.detail != "" {
		l.String("detail", r.detail)
	}
	if r.denialID != "" {
		l.String("denial_id", r.denialID)
	}
	if r.mode != "" {
		l.String("mode", r.mode)
	}
	if r.connect != "" {
		l.String("connect", r.connect)
	}
	if r.asked != "" {
		l.String("asked_host", r.asked)
	}
	if r.sni != "" {
		l.String("sni", r.sni)
	}
	if r.secret != "" {
		l.String("secret", r.secret)
	}
	if r.injected != "" {
		l.String("injected", r.injected)
	}
	if r.err != nil {
		l.String("error", r.err.Error())
	}
	return l
}

// refuse answers a blocked request: a short text body naming the host and
// the reason code, the same code in X-Abox-Reason, and a denial id that is
// also in the log line.
func (p *Proxy) refuse(w http.ResponseWriter, r *record, status int, reason string, closeConn bool) {
	p.redactRecord(r) // the answer names the path too
	r.verdict, r.reason, r.status = allowlist.Block, reason, status
	r.denialID = newDenialID()
	if r.shown != "" {
		reason = r.shown // the log line keeps the precise one
	}
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Abox-Reason", reason)
	h.Set("X-Abox-Denial-Id", r.denialID)
	h.Set("Cache-Control", "no-store")
	if ruleRefusal(r) {
		h.Set("X-Abox-Rule-Set", r.ruleSet)
	}
	if closeConn {
		h.Set("Connection", "close")
	}
	w.WriteHeader(status)
	host := r.host
	if host == "" {
		host = "(none)"
	}
	what := "blocked"
	if status == http.StatusBadGateway || status == http.StatusGatewayTimeout {
		what = "upstream failure for"
	} else if status == http.StatusBadRequest {
		what = "bad request for"
	}
	if ruleRefusal(r) {
		// Refused by the host's request rules: say which request and
		// whose rules, so the line to add or widen is plain.
		fmt.Fprintf(w, "abox proxy: blocked %s %s on %s: %s by the rules of %s (denial id %s)\n", r.method, r.path, host, reason, r.ruleSet, r.denialID)
		return
	}
	if r.secret != "" {
		fmt.Fprintf(w, "abox proxy: blocked %s %s on %s: %s (denial id %s)\n", r.method, r.path, host, r.secret, r.denialID)
		return
	}
	fmt.Fprintf(w, "abox proxy: %s %s: %s (denial id %s)\n", what, host, reason, r.denialID)
}

// ruleRefusal reports whether r was refused by its host's request rules.
func ruleRefusal(r *record) bool {
	if r.ruleSet == "" || r.verdict != allowlist.Block {
		return false
	}
	switch r.reason {
	case reqrules.ReasonMethodNotAllowed, reqrules.ReasonPathNotAllowed, reqrules.ReasonPathNotCanonical:
		return true
	}
	return false
}

const healthBody = "abox http filter: healthy\n"

func serveHealth(w http.ResponseWriter, r *record) {
	r.status = http.StatusOK
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Abox-Reason", policy.ReasonHealthcheck)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	n, _ := w.Write([]byte(healthBody))
	r.down += int64(n)
}

// maxLoggedPath bounds the path of a decision line: a guest's 8 KiB paths
// would otherwise make every line of its log that long.
const maxLoggedPath = 512

// pathOnly drops the query (it may hold tokens) and cuts a path longer
// than maxLoggedPath there, ending it with "…".
func pathOnly(r *http.Request) string {
	if r.URL == nil {
		return ""
	}
	p := r.URL.EscapedPath()
	if r.URL.Opaque != "" {
		// "http:https://evil.test/": show what was asked, not "".
		p = r.URL.Scheme + ":" + r.URL.Opaque
	}
	if i := strings.IndexByte(p, '?'); i >= 0 {
		p = p[:i]
	}
	if len(p) > maxLoggedPath {
		p = strings.ToValidUTF8(p[:maxLoggedPath], "") + "…"
	}
	return p
}
