package dnsfilter

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/upstream"
)

var errOverloaded = errors.New("too many upstream queries in flight")

// classLocalAlias is the block class (for the log) of an answer whose CNAME
// chain passes through a local or special-use name (upstream.LocalAlias).
const classLocalAlias = netclass.Class(allowlist.ReasonSpecialUseAlias)

// entry is a checked upstream answer for one (name, type, DO). It is
// immutable once built and shared between the cache and concurrent queries.
type entry struct {
	rcode int
	// answer, ns and extra hold only records that belong to the answer, with
	// TTLs clamped to the filter's floor and ceiling.
	answer, ns, extra []dns.RR
	ad                bool
	// blockClass is the class of the first forbidden address the upstream
	// answer held; non-empty means the whole answer is blocked.
	blockClass netclass.Class
	blockAddr  netip.Addr
	// addrs are every address the upstream answer held, stripped records'
	// too: they are classified again when the entry is used (forbidden).
	addrs []netip.Addr
	// classified is the last classification of addrs; it and logged are
	// the fields that change after the entry is built.
	classified atomic.Pointer[classification]
	// logged are the encoded fields of the decision lines of its hits.
	logged atomic.Pointer[loggedFields]
	// wire is the answer packed for a UDP client (see packed.go), nil when
	// it does not fit one; ttls are the offsets of its records' TTLs.
	wire []byte
	ttls []uint16
	// stored is when the entry was built; expires when it must be re-fetched.
	stored, expires time.Time
}

// resolve returns the checked answer for an allowed query: from the cache,
// or from the upstream with concurrent identical queries sharing one
// upstream round trip.
func (s *Server) resolve(ctx context.Context, name string, qtype uint16, do bool) (*entry, bool, time.Duration, error) {
	k := cacheKey{name: name, qtype: qtype, do: do}
	if e := s.cached(k, s.now()); e != nil {
		return e, true, 0, nil
	}
	type result struct {
		e   *entry
		rtt time.Duration
	}
	v, err, _ := s.flight.Do(k.String(), func() (any, error) {
		select {
		case s.inflight <- struct{}{}:
		default:
			s.st.overloaded.Add(1)
			return nil, errOverloaded
		}
		defer func() { <-s.inflight }()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.qto)
		defer cancel()
		s.st.upstreamQueries.Add(1)
		r, rtt, err := s.up.Exchange(ctx, buildQuery(name, qtype, do))
		if err == nil {
			switch r.Rcode {
			case dns.RcodeSuccess, dns.RcodeNameError:
			default:
				err = fmt.Errorf("upstream answered %s", dns.RcodeToString[r.Rcode])
			}
		}
		if err != nil {
			s.st.upstreamErrors.Add(1)
			return nil, err
		}
		e := s.check(name, qtype, r, s.now())
		if s.cache != nil {
			s.cache.put(k, e)
		}
		return result{e, rtt}, nil
	})
	if err != nil {
		return nil, false, 0, err
	}
	res := v.(result)
	return res.e, false, res.rtt, nil
}

// cached returns the entry of k live at now, or nil.
func (s *Server) cached(k cacheKey, now time.Time) *entry {
	if s.cache == nil {
		return nil
	}
	e := s.cache.get(k, now)
	if e != nil {
		s.st.cacheHits.Add(1)
	}
	return e
}

// buildQuery is the only message the upstream ever sees: our name (already
// normalised), the type, RD, and our own EDNS0 with no options.
func buildQuery(name string, qtype uint16, do bool) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name+".", qtype)
	m.RecursionDesired = true
	m.SetEdns0(upstream.DefaultUDPSize, do)
	return m
}

// check turns an upstream answer into an entry. Every address anywhere in
// the answer, authority and additional sections (every record type that
// carries one, see rrAddrs) is checked,
// including those of records we then strip: an upstream that volunteers a
// private address for anything is not trusted for the rest. Then only what
// belongs to the question is kept:
//   - answer: records owned by the name or by a name its CNAME chain reaches,
//     of the asked type, CNAMEs and (with DO) RRSIGs;
//   - authority: the SOA of a negative answer (for negative caching);
//   - additional: A/AAAA of targets named by the kept answer (MX, SRV,
//     HTTPS/SVCB, NS); everything else, including upstream OPT, is dropped.
func (s *Server) check(name string, qtype uint16, r *dns.Msg, now time.Time) *entry {
	e := &entry{rcode: r.Rcode, ad: r.AuthenticatedData, stored: now}
	for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range sec {
			for _, a := range rrAddrs(rr) {
				if c := s.addrs.Check(a); !netclass.Allowed(c) {
					e.blockClass, e.blockAddr = c, a
					e.expires = now.Add(time.Duration(s.clampTTL(rr.Header().Ttl)) * time.Second)
					return e
				}
				e.addrs = append(e.addrs, a)
			}
		}
	}
	if upstream.LocalAlias(name, r.Answer, s.addrs) != "" {
		// The upstream followed an alias into a name the filter never
		// forwards: its answer may describe the host's own network.
		e.blockClass = classLocalAlias
		e.expires = now.Add(time.Duration(s.minTTL) * time.Second)
		return e
	}
	chain := upstream.CNAMEChain(name, r.Answer)
	targets := map[string]bool{}
	for _, rr := range r.Answer {
		h := rr.Header()
		if !chain[strings.ToLower(h.Name)] || h.Class != dns.ClassINET {
			continue
		}
		switch {
		case h.Rrtype == dns.TypeCNAME, h.Rrtype == qtype, qtype == dns.TypeANY && h.Rrtype != dns.TypeOPT:
		case h.Rrtype == dns.TypeRRSIG:
		default:
			continue
		}
		rr = dns.Copy(rr)
		rr.Header().Ttl = s.clampTTL(rr.Header().Ttl)
		e.answer = append(e.answer, rr)
		if t := target(rr); t != "" {
			targets[strings.ToLower(t)] = true
		}
	}
	if len(e.answer) == 0 {
		for _, rr := range r.Ns {
			if soa, ok := rr.(*dns.SOA); ok && soa.Hdr.Class == dns.ClassINET {
				soa = dns.Copy(soa).(*dns.SOA)
				// RFC 2308: negative answers are cached for min(SOA TTL, MINIMUM).
				soa.Hdr.Ttl = s.clampTTL(min(soa.Hdr.Ttl, soa.Minttl))
				e.ns = []dns.RR{soa}
				break
			}
		}
	}
	for _, rr := range r.Extra {
		h := rr.Header()
		// The addresses of a local target (an MX or SRV naming mail.local)
		// came from wherever the upstream resolves local names: the guest
		// may ask for them, and is refused.
		if (h.Rrtype == dns.TypeA || h.Rrtype == dns.TypeAAAA) && targets[strings.ToLower(h.Name)] && !allowlist.LocalName(h.Name) {
			rr = dns.Copy(rr)
			rr.Header().Ttl = s.clampTTL(rr.Header().Ttl)
			e.extra = append(e.extra, rr)
		}
	}
	ttl := s.maxTTL
	for _, sec := range [][]dns.RR{e.answer, e.ns} {
		for _, rr := range sec {
			ttl = min(ttl, rr.Header().Ttl)
		}
	}
	if len(e.answer) == 0 && len(e.ns) == 0 {
		ttl = s.minTTL
	}
	e.expires = now.Add(time.Duration(ttl) * time.Second)
	e.pack(name, qtype)
	return e
}

// classifyEvery is how long a classification of an entry's addresses is
// reused. The classes depend on the host's own addresses, which netclass
// itself reads again at most once a second: classifying more often could
// not see a change sooner.
const classifyEvery = time.Second

// classification is the outcome of classifying an entry's addresses with
// policy by at time at: the first forbidden address and its class, or "".
type classification struct {
	class netclass.Class
	addr  netip.Addr
	by    *netclass.Policy
	at    time.Time
}

// forbidden returns the class of the first address of e the guest may not
// be given now, or "". It runs on every use of the entry, cached or not:
// the host's own addresses, which the classification depends on, change.
func (s *Server) forbidden(e *entry, now time.Time) (netclass.Class, netip.Addr) {
	if e.blockClass != "" {
		return e.blockClass, e.blockAddr
	}
	if len(e.addrs) == 0 {
		return "", netip.Addr{}
	}
	if c := e.classified.Load(); c != nil && c.by == s.addrs && !now.Before(c.at) && now.Sub(c.at) < classifyEvery {
		return c.class, c.addr
	}
	c := &classification{by: s.addrs, at: now}
	for _, a := range e.addrs {
		if cl := s.addrs.Check(a); !netclass.Allowed(cl) {
			c.class, c.addr = cl, a
			break
		}
	}
	e.classified.Store(c)
	return c.class, c.addr
}

func (s *Server) clampTTL(ttl uint32) uint32 { return min(max(ttl, s.minTTL), s.maxTTL) }

// Type codes miekg/dns has no struct for, whose data holds an IPv4 or IPv6
// address: they arrive as RFC 3597 records.
const (
	typeWKS = 11 // RFC 1035: an IPv4 address and a port bitmap
	typeA6  = 38 // RFC 2874, historic: a partial IPv6 address
)

// rrAddrs returns the addresses a record hands out, of every type that
// carries one: A, AAAA, the ipv4hint/ipv6hint of SVCB and HTTPS, the
// gateway of IPSECKEY, the relay of AMTRELAY, the locator of L32 (an IPv4
// address, RFC 6742), the prefixes of APL (checked by their network
// address) and WKS. A type that carries an address abox cannot read whole
// (A6, or WKS or any of these in a form that does not parse) yields the zero
// Addr, which netclass calls Invalid: the answer is refused, not passed
// unchecked.
func rrAddrs(rr dns.RR) []netip.Addr {
	var ips []net.IP
	switch v := rr.(type) {
	case *dns.A:
		ips = []net.IP{v.A}
	case *dns.AAAA:
		ips = []net.IP{v.AAAA}
	case *dns.SVCB:
		ips = svcbHints(v.Value)
	case *dns.HTTPS:
		ips = svcbHints(v.Value)
	case *dns.IPSECKEY:
		if t := v.GatewayType; t == dns.IPSECGatewayIPv4 || t == dns.IPSECGatewayIPv6 {
			ips = []net.IP{v.GatewayAddr}
		}
	case *dns.AMTRELAY:
		if t := v.GatewayType & 0x7f; t == dns.AMTRELAYIPv4 || t == dns.AMTRELAYIPv6 {
			ips = []net.IP{v.GatewayAddr}
		}
	case *dns.L32:
		ips = []net.IP{v.Locator32}
	case *dns.APL:
		for _, p := range v.Prefixes {
			ips = append(ips, p.Network.IP)
		}
	case *dns.RFC3597:
		switch v.Hdr.Rrtype {
		case typeWKS:
			if b, err := hex.DecodeString(v.Rdata); err == nil && len(b) >= 4 {
				ips = []net.IP{net.IP(b[:4])}
			} else {
				ips = []net.IP{nil}
			}
		case typeA6:
			ips = []net.IP{nil}
		default:
			return nil
		}
	default:
		return nil
	}
	out := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		a, ok := netip.AddrFromSlice(ip)
		if !ok {
			// Unparseable is not public: netclass calls the zero Addr Invalid.
			a = netip.Addr{}
		}
		out = append(out, a)
	}
	return out
}

func svcbHints(kvs []dns.SVCBKeyValue) []net.IP {
	var ips []net.IP
	for _, kv := range kvs {
		switch h := kv.(type) {
		case *dns.SVCBIPv4Hint:
			ips = append(ips, h.Hint...)
		case *dns.SVCBIPv6Hint:
			ips = append(ips, h.Hint...)
		}
	}
	return ips
}

// target is the host name a record points clients to, whose addresses may
// ride along in the additional section.
func target(rr dns.RR) string {
	switch v := rr.(type) {
	case *dns.MX:
		return v.Mx
	case *dns.SRV:
		return v.Target
	case *dns.NS:
		return v.Ns
	case *dns.SVCB:
		return v.Target
	case *dns.HTTPS:
		return v.Target
	}
	return ""
}

// reply builds the client's answer from a checked entry, with TTLs aged by
// the time the entry has spent in the cache.
func (e *entry) reply(req *dns.Msg, opt *dns.OPT, now time.Time) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	m.Rcode = e.rcode
	age := uint32(max(now.Sub(e.stored), 0) / time.Second)
	m.Answer = aged(e.answer, age)
	m.Ns = aged(e.ns, age)
	m.Extra = aged(e.extra, age)
	if opt != nil {
		m.AuthenticatedData = e.ad && (opt.Do() || req.AuthenticatedData)
		m.Extra = append(m.Extra, newOPT(opt.Do()))
	}
	return m
}

func aged(rrs []dns.RR, age uint32) []dns.RR {
	if len(rrs) == 0 {
		return nil
	}
	out := make([]dns.RR, len(rrs))
	for i, rr := range rrs {
		rr = dns.Copy(rr)
		h := rr.Header()
		h.Ttl = max(h.Ttl-min(age, h.Ttl), 1)
		out[i] = rr
	}
	return out
}
