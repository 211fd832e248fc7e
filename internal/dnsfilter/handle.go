package dnsfilter

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// Reason codes of the DNS filter, beyond those of packages allowlist and
// policy. They are stable: they appear in logs and in EDE texts.
const (
	// ReasonRebinding: an allowed name answered with an address the guest may not reach.
	ReasonRebinding = "dns_rebinding"
	// ReasonPrivateReverse: a reverse lookup of a private or reserved range
	// or of the host's network (never forwarded).
	ReasonPrivateReverse = policy.ReasonPrivateReverse
	// ReasonQuestionCount: a query without exactly one question.
	ReasonQuestionCount = "question_count"
	// ReasonUnparsable: a message that does not parse as DNS (FORMERR).
	ReasonUnparsable = "unparsable_query"
	// ReasonMalformed: a query carrying answer, authority or stray additional records.
	ReasonMalformed = "malformed_query"
	// ReasonOpcode: an opcode other than QUERY (UPDATE, NOTIFY, ...).
	ReasonOpcode = "opcode_refused"
	// ReasonClass: a class other than IN (CHAOS version.bind, ...).
	ReasonClass = "class_refused"
	// ReasonZoneTransfer: AXFR or IXFR.
	ReasonZoneTransfer = "zone_transfer"
	// ReasonQtype: a meta query type (OPT, TSIG, TKEY, MAILA, MAILB) or type 0.
	ReasonQtype = "qtype_refused"
	// ReasonEDNSVersion: an EDNS version other than 0.
	ReasonEDNSVersion = "edns_version"
	// ReasonRateLimited: the client exceeded its query rate.
	ReasonRateLimited = "rate_limited"
	// ReasonUpstream: the upstream resolvers failed; the verdict was allow.
	ReasonUpstream = "upstream_error"
	// ReasonOverloaded: too many upstream queries in flight.
	ReasonOverloaded = "overloaded"
)

// decision is what one query led to, for the log line and counters.
type decision struct {
	// at is when the query was decided (answered, for one that went
	// upstream): the one reading of the clock for its rate, cache, TTLs and
	// line. The datagrams of one batched read share the reading taken when
	// the read returned.
	at      time.Time
	name    string
	qtype   uint16
	verdict allowlist.Verdict
	reason  string
	rule    string
	class   string // address class of a rebinding block
	rcode   int
	cached  bool
	rtt     time.Duration
	err     error
	// hit is the cache entry an allowed answer came from.
	hit *entry
	// policyBlock marks a name the policy blocks whose answer decide left
	// to its caller: blocked() with this verdict, reason and rule, or the
	// same packed by blockedWire.
	policyBlock bool
}

// policyAnswer builds the answer decide left to its caller, if it did.
func (d decision) policyAnswer(req, resp *dns.Msg) *dns.Msg {
	if d.policyBlock {
		return blocked(req, allowlist.Decision{Verdict: d.verdict, Reason: d.reason, Rule: d.rule})
	}
	return resp
}

// Handle answers one parsed query from client over network ("udp" or
// "tcp"). It returns nil when nothing must be sent (req is a response).
func (s *Server) Handle(ctx context.Context, client netip.Addr, network string, req *dns.Msg) *dns.Msg {
	if req.Response {
		return nil
	}
	s.st.queries.Add(1)
	var p pending
	resp, d, allowed := s.decide(ctx, client, req, s.now(), nil, &p)
	if allowed {
		resp, d = s.finish(ctx, req, &p, d)
	}
	return s.conclude(client, network, req, d.policyAnswer(req, resp), d, nil)
}

// handleNow is Handle for the batched UDP path: a cached answer is packed
// into dst when it fits as it is (wire), and a query whose answer must wait
// on the upstream is returned pending instead of waited for. The query came
// in at now; pm is the reader's memo of name decisions, and the decision
// line goes to lb when it is not nil (see logDecision).
func (s *Server) handleNow(ctx context.Context, client netip.Addr, req *dns.Msg, now time.Time, pm *policyMemo, dst []byte, lb *decisionlog.Batch) (resp *dns.Msg, wire []byte, up *udpPending) {
	if req.Response {
		return nil, nil, nil
	}
	s.st.queries.Add(1)
	var p pending
	resp, d, allowed := s.decide(ctx, client, req, now, pm, &p)
	if allowed && p.e == nil {
		return nil, nil, &udpPending{req: req, client: client, d: d, p: p}
	}
	if allowed {
		if resp, wire, d = s.answer(req, p.opt, p.e, p.rule, d, dst); wire != nil {
			s.logDecision(client, d, lb)
			return nil, wire, nil
		}
	}
	if d.policyBlock {
		if wire, ok := blockedWire(dst, req, d.reason, d.rule); ok {
			s.logDecision(client, d, lb)
			return nil, wire, nil
		}
	}
	return s.conclude(client, "udp", req, d.policyAnswer(req, resp), d, lb), nil, nil
}

// conclude sets TC when resp does not fit the client and logs the decision
// (into lb when it is not nil).
func (s *Server) conclude(client netip.Addr, network string, req, resp *dns.Msg, d decision, lb *decisionlog.Batch) *dns.Msg {
	if resp.Truncated = resp.Truncated || !fit(resp, maxSize(req, network)); resp.Truncated {
		s.st.truncated.Add(1)
	}
	s.logDecision(client, d, lb)
	return resp
}

// pending is an allowed query: its cache entry, or nil when the answer
// must come from the upstream.
type pending struct {
	name  string
	qtype uint16
	opt   *dns.OPT
	rule  string
	e     *entry
}

// decide runs the decision path of a query that came in at now. Every
// branch returns a complete response
// (or leaves it to the caller, see policyBlock), except an allowed query:
// that one is described in p, its cache entry or none, for answer or
// finish, and decide reports allowed.
func (s *Server) decide(ctx context.Context, client netip.Addr, req *dns.Msg, now time.Time, pm *policyMemo, p *pending) (_ *dns.Msg, _ decision, allowed bool) {
	d := decision{at: now}
	if len(req.Question) == 1 {
		d.name, d.qtype = strings.TrimSuffix(req.Question[0].Name, "."), req.Question[0].Qtype
	}
	if s.limit != nil {
		if ok, warn := s.limit.Allow(client, d.at); !ok {
			// The decision has its line as any refusal (within the
			// client's budget of refusal lines, then folded into its
			// aggregate line); the operator is also warned, sparingly.
			s.st.rateLimited.Add(1)
			d.verdict, d.reason, d.rcode = allowlist.Block, ReasonRateLimited, dns.RcodeRefused
			if warn {
				s.log.LogAttrs(ctx, slog.LevelWarn, "dns rate limit exceeded",
					slog.String("client", client.String()), slog.String("reason", ReasonRateLimited))
			}
			return refusal(req, dns.RcodeRefused, dns.ExtendedErrorCodeProhibited, ReasonRateLimited), d, false
		}
	}
	resp, d := s.checkQuery(req, d)
	if resp != nil {
		return resp, d, false
	}
	n, q := d.name, req.Question[0]
	pd := s.decideName(n, pm)
	d.verdict, d.reason, d.rule = pd.Verdict, pd.Reason, pd.Rule
	if pd.Verdict != allowlist.Allow {
		s.st.blocked.Add(1)
		d.rcode, d.policyBlock = dns.RcodeNameError, true
		return nil, d, false
	}

	// Allowed: answered from the cache entry, or from the upstream.
	opt, _ := queryOPT(req)
	do := opt != nil && opt.Do()
	*p = pending{name: n, qtype: q.Qtype, opt: opt, rule: pd.Rule}
	if p.e = s.cached(cacheKey{name: n, qtype: q.Qtype, do: do}, d.at); p.e != nil {
		d.cached = true
	}
	return nil, d, true
}

// checkQuery runs the protocol checks of req and names the query. It returns a
// response when req is refused, answered locally or its name is invalid.
func (s *Server) checkQuery(req *dns.Msg, d decision) (*dns.Msg, decision) {
	// Header and sections. The upstream only ever sees a query we build, so
	// these checks are about answering honestly and logging the attempt.
	if len(req.Question) != 1 {
		s.st.formerr.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonQuestionCount, dns.RcodeFormatError
		return formerr(req), d
	}
	if req.Opcode != dns.OpcodeQuery {
		s.st.refused.Add(1)
		rcode := dns.RcodeNotImplemented
		if req.Opcode == dns.OpcodeUpdate || req.Opcode == dns.OpcodeNotify {
			// Understood, and refused by policy: this filter serves no zone.
			rcode = dns.RcodeRefused
		}
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonOpcode, rcode
		return refusal(req, rcode, dns.ExtendedErrorCodeNotSupported, ReasonOpcode), d
	}
	q := req.Question[0]
	if q.Qclass != dns.ClassINET {
		s.st.refused.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonClass, dns.RcodeRefused
		return refusal(req, dns.RcodeRefused, dns.ExtendedErrorCodeNotSupported, ReasonClass), d
	}
	switch q.Qtype {
	case dns.TypeAXFR, dns.TypeIXFR:
		s.st.refused.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonZoneTransfer, dns.RcodeRefused
		return refusal(req, dns.RcodeRefused, dns.ExtendedErrorCodeNotSupported, ReasonZoneTransfer), d
	case dns.TypeNone, dns.TypeOPT, dns.TypeTSIG, dns.TypeTKEY, dns.TypeMAILA, dns.TypeMAILB:
		s.st.refused.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonQtype, dns.RcodeRefused
		return refusal(req, dns.RcodeRefused, dns.ExtendedErrorCodeNotSupported, ReasonQtype), d
	}

	opt, ok := queryOPT(req)
	if len(req.Answer) > 0 || len(req.Ns) > 0 || !ok {
		s.st.formerr.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonMalformed, dns.RcodeFormatError
		return formerr(req), d
	}
	if opt != nil && opt.Version() != 0 {
		s.st.formerr.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonEDNSVersion, dns.RcodeBadVers
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeBadVers)
		m.SetEdns0(MaxUDPSize, false)
		return m, d
	}
	// The name.
	n, err := allowlist.NormalizeName(q.Name)
	if err != nil {
		s.st.blocked.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, allowlist.ReasonInvalidName, dns.RcodeNameError
		return blocked(req, allowlist.Decision{Verdict: allowlist.Block, Reason: allowlist.ReasonInvalidName}), d
	}
	d.name = n
	if n == policy.HealthcheckName {
		s.st.healthcheck.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Allow, policy.ReasonHealthcheck, dns.RcodeSuccess
		return s.healthcheck(req), d
	}
	if netclass.IsReverseName(n) && !netclass.ReversePublic(n, s.addrs) {
		s.st.blocked.Add(1)
		d.verdict, d.reason, d.rcode = allowlist.Block, ReasonPrivateReverse, dns.RcodeNameError
		return blocked(req, allowlist.Decision{Verdict: allowlist.Block, Reason: ReasonPrivateReverse}), d
	}
	return nil, d
}

// finish answers an allowed query from its cache entry or through the
// upstream, then under the policy in force once the answer is in.
func (s *Server) finish(ctx context.Context, req *dns.Msg, p *pending, d decision) (*dns.Msg, decision) {
	if p.e != nil {
		resp, _, d := s.answer(req, p.opt, p.e, p.rule, d, nil)
		return resp, d
	}
	e, cached, rtt, err := s.resolve(ctx, p.name, p.qtype, p.opt != nil && p.opt.Do())
	d.cached, d.rtt, d.at = cached, rtt, s.now()
	if err != nil {
		d.err = err
		d.reason, d.rcode = ReasonUpstream, dns.RcodeServerFailure
		if err == errOverloaded {
			d.reason = ReasonOverloaded
		}
		code := dns.ExtendedErrorCodeNetworkError
		return refusal(req, dns.RcodeServerFailure, code, d.reason), d
	}
	if !cached {
		// The policy may have changed while the upstream answered (an entry
		// removed, a switch to active mode): the answer goes out under the
		// policy in force now, never the one the query started under.
		if now := policy.Evaluate(s.pol.List(), s.pol.Mode(), p.name); now.Verdict != allowlist.Allow {
			s.st.blocked.Add(1)
			d.verdict, d.reason, d.rule, d.rcode = now.Verdict, now.Reason, now.Rule, dns.RcodeNameError
			return blocked(req, now), d
		}
	}
	resp, _, d := s.answer(req, p.opt, e, p.rule, d, nil)
	return resp, d
}

// answer answers an allowed query from its checked entry: NXDOMAIN when
// the upstream's answer held an address the guest may not be given now.
// With dst, an answer that fits a UDP client as it is comes back packed
// into dst (wire) instead of as a message.
func (s *Server) answer(req *dns.Msg, opt *dns.OPT, e *entry, rule string, d decision, dst []byte) (*dns.Msg, []byte, decision) {
	now := d.at
	if class, _ := s.forbidden(e, now); class != "" {
		s.st.blocked.Add(1)
		s.st.rebinding.Add(1)
		d.verdict, d.reason, d.class, d.rcode = allowlist.Block, ReasonRebinding, string(class), dns.RcodeNameError
		// The guest is told forbidden_address, never the class.
		return blocked(req, allowlist.Decision{Verdict: allowlist.Block, Reason: policy.ReasonForbiddenAddress, Rule: rule}), nil, d
	}
	s.st.allowed.Add(1)
	d.rcode = e.rcode
	if d.cached {
		d.hit = e
	}
	if dst != nil {
		if b, ok := e.packedReply(dst, req, opt, now, maxSize(req, "udp")); ok {
			return nil, b, d
		}
	}
	return e.reply(req, opt, now), nil, d
}

// queryOPT returns the query's OPT record (nil without EDNS) and whether the
// additional section is acceptable: at most one record, and that an OPT.
func queryOPT(req *dns.Msg) (*dns.OPT, bool) {
	switch len(req.Extra) {
	case 0:
		return nil, true
	case 1:
		opt, ok := req.Extra[0].(*dns.OPT)
		return opt, ok
	}
	return nil, false
}

// maxSize is the largest answer the client can take over network.
func maxSize(req *dns.Msg, network string) int {
	if network == "tcp" {
		return dns.MaxMsgSize
	}
	size := dns.MinMsgSize
	if opt, ok := queryOPT(req); ok && opt != nil {
		size = max(int(opt.UDPSize()), dns.MinMsgSize)
	}
	return min(size, MaxUDPSize)
}

// fit makes m at most size bytes: additional records go first (except the
// OPT), then authority; if the answer still does not fit, the records that
// do are kept and TC is set so the client may retry over TCP. It reports
// whether everything fit without TC.
func fit(m *dns.Msg, size int) bool {
	// A message without records but the OPT (a block, a refusal) holds
	// one name: compressing it changes no byte and costs a map.
	m.Compress = len(m.Answer)+len(m.Ns) > 0 || len(m.Extra) > 1 || (len(m.Extra) == 1 && m.Extra[0].Header().Rrtype != dns.TypeOPT)
	if m.Len() <= size {
		return true
	}
	var opt []dns.RR
	for _, rr := range m.Extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			opt = append(opt, rr)
		}
	}
	m.Extra = opt
	if m.Len() <= size {
		return true
	}
	m.Ns = nil
	if m.Len() <= size {
		return true
	}
	m.Truncate(size)
	m.Truncated = true
	return false
}

// formerr answers a message we will not interpret. The question is echoed
// only when there is exactly one.
func formerr(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.Id, m.Response, m.Opcode, m.RecursionDesired = req.Id, true, req.Opcode, req.RecursionDesired
	m.RecursionAvailable = true
	m.Rcode = dns.RcodeFormatError
	if len(req.Question) == 1 {
		m.Question = []dns.Question{req.Question[0]}
	}
	return m
}

// refusal answers rcode with an EDE carrying reason, when the client sent EDNS.
func refusal(req *dns.Msg, rcode int, ede uint16, reason string) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	if opt, ok := queryOPT(req); ok && opt != nil {
		addEDE(m, opt, ede, "reason="+reason)
	}
	return m
}

// blocked answers NXDOMAIN for a policy block, with EDE Blocked whose text
// carries the reason code and the rule, never the address or its class: the
// guest learns nothing about internal hosts (the log line has the class).
func blocked(req *dns.Msg, d allowlist.Decision) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, dns.RcodeNameError)
	m.RecursionAvailable = true
	if opt, ok := queryOPT(req); ok && opt != nil {
		text := "reason=" + d.Reason
		if d.Rule != "" {
			text += " rule=" + d.Rule
		}
		addEDE(m, opt, dns.ExtendedErrorCodeBlocked, text)
	}
	return m
}

func addEDE(m *dns.Msg, clientOPT *dns.OPT, code uint16, text string) {
	o := newOPT(clientOPT.Do())
	o.Option = append(o.Option, &dns.EDNS0_EDE{InfoCode: code, ExtraText: text})
	m.Extra = append(m.Extra, o)
}

func newOPT(do bool) *dns.OPT {
	o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	o.SetUDPSize(MaxUDPSize)
	if do {
		o.SetDo()
	}
	return o
}

var loopback = net.IPv4(127, 0, 0, 1).To4()

// healthcheck answers healthcheck.abox.local locally: A 127.0.0.1, NODATA
// for every other type.
func (s *Server) healthcheck(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	m.RecursionAvailable = true
	q := req.Question[0]
	if q.Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: s.minTTL}, A: loopback}}
	}
	if opt, _ := queryOPT(req); opt != nil {
		m.Extra = append(m.Extra, newOPT(opt.Do()))
	}
	return m
}

// logDecision writes the decision line, into lb when it is not nil (the
// batched UDP path queues a read's lines together before sending its
// answers). The fields and their order are those the line had when slog
// wrote it; see docs/dns.md.
func (s *Server) logDecision(client netip.Addr, d decision, lb *decisionlog.Batch) {
	s.metrics.observe(&d)
	if s.dlog == nil {
		return
	}
	// A refusal past the client's flood budget is only counted: no line
	// is built for it.
	if d.verdict == allowlist.Block && !s.dlog.AdmitRefusal(client, d.reason) {
		return
	}
	// So is a healthcheck past the client's budget of lines that reached
	// nothing (a flood of them would rotate the log of what did).
	if d.reason == policy.ReasonHealthcheck && !s.dlog.AdmitLocal(client, d.reason) {
		return
	}
	level := slog.LevelInfo
	if d.err != nil {
		level = slog.LevelWarn
	}
	var l *decisionlog.Line
	if lb != nil {
		l = lb.NewLine(d.at, level, "dns")
	} else {
		l = decisionlog.NewLine(d.at, level, "dns")
	}
	l.Addr("client", client)
	if e := d.hit; e != nil && d.cached && d.err == nil && d.class == "" && d.rtt == 0 {
		l.Fields(e.decisionFields(d))
	} else {
		decisionFields(l, d)
	}
	switch allowed := d.verdict == allowlist.Allow; {
	case lb != nil && allowed:
		lb.DoneAllowed() // not in the refusal stream; see docs/dns.md
	case lb != nil:
		lb.Done()
	case allowed:
		s.dlog.EmitAllowed(l) // not in the refusal stream; see docs/dns.md
	default:
		s.dlog.Emit(l)
	}
}

// decisionFields adds the fields of d's line after the client's address.
func decisionFields(l *decisionlog.Line, d decision) {
	l.String("name", d.name).
		String("type", typeString(d.qtype)).
		String("verdict", string(d.verdict)).
		String("reason", d.reason).
		String("rule", d.rule).
		String("rcode", dns.RcodeToString[d.rcode]).
		Float("upstream_ms", float64(d.rtt.Microseconds())/1000).
		Bool("cached", d.cached)
	if d.class != "" {
		l.String("class", d.class)
	}
	if d.err != nil {
		l.String("error", d.err.Error())
	}
}

// loggedFields are the encoded fields of an entry's cache-hit lines for
// one policy reason and rule.
type loggedFields struct {
	reason, rule string
	f            decisionlog.Fields
}

// decisionFields returns the fields of the line of d, a hit on e: every
// hit on one entry under one rule has the same, so they are encoded once.
func (e *entry) decisionFields(d decision) decisionlog.Fields {
	if lf := e.logged.Load(); lf != nil && lf.reason == d.reason && lf.rule == d.rule {
		return lf.f
	}
	lf := &loggedFields{reason: d.reason, rule: d.rule, f: decisionlog.Encode(func(l *decisionlog.Line) { decisionFields(l, d) })}
	e.logged.Store(lf)
	return lf.f
}
