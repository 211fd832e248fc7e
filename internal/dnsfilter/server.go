// Package dnsfilter is the per-instance DNS filter: it answers allowlisted
// names through the upstream resolvers, checks every address an answer ends
// in, and refuses everything else with a reason.
package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/abox-dev/abox/internal/budget"
	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/metrics"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// Exchanger sends a query the filter built to the upstream resolvers.
// *upstream.Client implements it.
type Exchanger interface {
	Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error)
}

// Defaults for Config fields left zero.
const (
	DefaultMinTTL       = 5 * time.Second
	DefaultMaxTTL       = 300 * time.Second
	DefaultCacheSize    = 10000
	DefaultRateLimit    = 200 // queries per second per client
	DefaultRateBurst    = 400
	DefaultRateClients  = 4096
	DefaultQueryTimeout = 5 * time.Second
	DefaultMaxInflight  = 256
	DefaultMaxTCPConns  = 128
	// MaxUDPSize is the largest UDP answer we ever send (DNS Flag Day 2020):
	// it avoids fragmentation, which the packet filter would not pass.
	MaxUDPSize = 1232
)

// Config configures a Server.
type Config struct {
	// PacketConn and Listener are the bound UDP and TCP sockets; at least
	// one is required. The Server owns them from New on.
	PacketConn net.PacketConn
	Listener   net.Listener
	// Policy decides names; required.
	Policy *policy.Engine
	// Upstream resolves allowed queries; required.
	Upstream Exchanger
	// Addrs decides which answer addresses the guest may be given; nil
	// permits only public addresses.
	Addrs *netclass.Policy
	// DecisionLog receives one JSON line per decision (msg "dns"); nil
	// discards them. The caller closes it after Serve returns.
	DecisionLog *decisionlog.Writer
	// Logger receives diagnostics, such as a client going over its rate;
	// nil discards. Point it at DecisionLog (slog.NewJSONHandler accepts
	// it) to keep both in one stream.
	Logger *slog.Logger
	// MinTTL and MaxTTL bound the TTL of every record we send and cache.
	MinTTL, MaxTTL time.Duration
	// CacheSize bounds the number of cached answers; negative disables the cache.
	CacheSize int
	// RateLimit is the sustained queries per second allowed per client
	// address (IPv6 clients per /64) and RateBurst the bucket size; a
	// negative RateLimit disables limiting. RateClients bounds the number of
	// clients tracked; past it, new clients share one bucket.
	RateLimit   float64
	RateBurst   int
	RateClients int
	// Budget, when set (and RateLimit is not negative), is the per-client
	// bucket to charge instead of one of the filter's own, shared with the
	// daemon's resolver; RateLimit, RateBurst and RateClients are then unused.
	Budget *budget.Limiter
	// Metrics, when set, receives the filter's Prometheus metrics
	// (docs/metrics.md); nil measures nothing.
	Metrics *metrics.Registry
	// QueryTimeout bounds the upstream part of one query.
	QueryTimeout time.Duration
	// MaxInflight bounds concurrent upstream queries; past it queries get
	// SERVFAIL at once rather than piling up.
	MaxInflight int
	// MaxTCPConns bounds concurrent TCP connections; at the bound the quietest
	// is closed for a new one (see evictingListener).
	MaxTCPConns int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Server is the DNS filter. It implements daemon.Service and dns.Handler.
type Server struct {
	pc  net.PacketConn
	ln  net.Listener
	tcp *evictingListener // ln, when there is one
	pol *policy.Engine
	up  Exchanger
	// addrs is never nil.
	addrs  *netclass.Policy
	log    *slog.Logger
	dlog   *decisionlog.Writer // nil when decisions are not logged
	now    func() time.Time
	minTTL uint32 // seconds, <= maxTTL
	maxTTL uint32 // seconds
	qto    time.Duration

	cache    *cache          // nil when disabled
	limit    *budget.Limiter // nil: no limit
	flight   singleflight.Group
	inflight chan struct{}

	// base is the context ServeDNS derives query contexts from, set by Serve.
	base atomic.Pointer[context.Context]

	st counters
	// metrics is nil when the filter is not measured.
	metrics *dnsMetrics
	// panics reports panics recovered while answering one query or batch
	// (see internal/contain).
	panics *contain.Reporter
}

// New validates cfg and returns a server; nothing is served until Serve.
func New(cfg Config) (*Server, error) {
	if cfg.PacketConn == nil && cfg.Listener == nil {
		return nil, errors.New("dns filter: no socket to serve on")
	}
	if cfg.Policy == nil {
		return nil, errors.New("dns filter: no policy")
	}
	if cfg.Upstream == nil {
		return nil, errors.New("dns filter: no upstream")
	}
	s := &Server{pc: cfg.PacketConn, ln: cfg.Listener, pol: cfg.Policy, up: cfg.Upstream, addrs: cfg.Addrs, log: cfg.Logger, dlog: cfg.DecisionLog, now: cfg.Now,
		metrics: newDNSMetrics(cfg.Metrics)}
	if s.addrs == nil {
		s.addrs = netclass.NewPolicy(nil, nil)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.panics = contain.New(s.log)
	minTTL, maxTTL := orDefault(cfg.MinTTL, DefaultMinTTL), orDefault(cfg.MaxTTL, DefaultMaxTTL)
	if minTTL > maxTTL {
		return nil, fmt.Errorf("dns filter: minimum TTL %s is above maximum TTL %s", minTTL, maxTTL)
	}
	s.minTTL, s.maxTTL = uint32(minTTL/time.Second), uint32(maxTTL/time.Second)
	s.qto = orDefault(cfg.QueryTimeout, DefaultQueryTimeout)
	if cfg.CacheSize >= 0 {
		s.cache = newCache(orDefault(cfg.CacheSize, DefaultCacheSize))
	}
	if cfg.RateLimit >= 0 {
		s.limit = cfg.Budget
		if s.limit == nil {
			s.limit = budget.New(orDefault(cfg.RateLimit, DefaultRateLimit), orDefault(cfg.RateBurst, DefaultRateBurst), orDefault(cfg.RateClients, DefaultRateClients))
		}
	}
	s.inflight = make(chan struct{}, orDefault(cfg.MaxInflight, DefaultMaxInflight))
	if s.ln != nil {
		s.tcp = newEvictingListener(s.ln, orDefault(cfg.MaxTCPConns, DefaultMaxTCPConns))
		s.tcp.log = s.log
		s.ln = s.tcp
	}
	return s, nil
}

func orDefault[T int | float64 | time.Duration](v, d T) T {
	if v <= 0 {
		return d
	}
	return v
}

// Listen binds UDP and TCP on the same address (port 0 picks one free port
// for both).
func Listen(addr string) (net.PacketConn, net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dns listen address %q: %w (want IP:PORT, for example 127.0.0.1:53)", addr, err)
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, nil, fmt.Errorf("dns listen address %q: %q is not an IP address", addr, host)
	}
	for attempt := 0; ; attempt++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dns filter: listening on udp %s: %w", addr, err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		// With port 0 the kernel may pick a UDP port whose TCP twin is taken.
		if port != "0" || attempt == 10 {
			return nil, nil, fmt.Errorf("dns filter: listening on tcp %s: %w", addr, err)
		}
	}
}

// Name is the component name used by the local API and CLI.
func (s *Server) Name() string { return "dns" }

// Addr returns the UDP address served (or the TCP one if there is no UDP socket).
func (s *Server) Addr() net.Addr {
	if s.pc != nil {
		return s.pc.LocalAddr()
	}
	return s.ln.Addr()
}

// Serve answers queries until ctx ends, then shuts down within 5 seconds.
func (s *Server) Serve(ctx context.Context) error {
	s.base.Store(&ctx)
	var servers []*dns.Server
	g, gctx := errgroup.WithContext(ctx)
	if u, ok := batchable(s.pc); ok {
		g.Go(func() error {
			if err := s.serveUDP(gctx, u); err != nil && gctx.Err() == nil {
				return fmt.Errorf("serving dns: %w", err)
			}
			return nil
		})
	} else if s.pc != nil {
		servers = append(servers, &dns.Server{PacketConn: s.pc, Handler: s, MsgAcceptFunc: s.acceptQuery, MsgInvalidFunc: s.invalid, UDPSize: dns.MaxMsgSize})
	}
	if s.ln != nil {
		servers = append(servers, &dns.Server{Listener: s.ln, Handler: s, MsgAcceptFunc: s.acceptQuery, MsgInvalidFunc: s.invalid,
			ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, MaxTCPQueries: 256,
			IdleTimeout: func() time.Duration { return 10 * time.Second }})
	}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		done := make(chan error, 1)
		g.Go(func() error {
			err := srv.ActivateAndServe()
			done <- err
			if err != nil && gctx.Err() == nil {
				return fmt.Errorf("serving dns: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			select {
			case <-started:
			case <-done:
				return nil
			}
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.ShutdownContext(sctx); err != nil {
				return fmt.Errorf("stopping dns server: %w", err)
			}
			return nil
		})
	}
	return g.Wait()
}

// acceptQuery ignores responses (two servers must never answer each other
// in a loop) and answers FORMERR, before parsing, a query whose header
// counts are not those of a query: one question, no answer or authority
// records, at most the OPT record (other opcodes are refused by ServeDNS;
// an IXFR, whose authority section holds an SOA, gets FORMERR here instead
// of REFUSED: it is refused either way). miekg/dns would otherwise parse a header
// that promises more records than the message holds by quietly lowering the
// counts. Queries that pass go to ServeDNS, which checks the sections
// themselves so that each refusal is counted and logged.
//
// More than one question is refused before parsing whatever the opcode:
// the FORMERR for a message that then fails to parse echoes the questions
// parsed so far, and a dozen long names would not fit a UDP answer.
func (s *Server) acceptQuery(dh dns.Header) dns.MsgAcceptAction {
	if dh.Bits&(1<<15) != 0 {
		return dns.MsgIgnore
	}
	opcode := int(dh.Bits>>11) & 0xF
	if dh.Qdcount > 1 || opcode == dns.OpcodeQuery && (dh.Qdcount != 1 || dh.Ancount != 0 || dh.Nscount != 0 || dh.Arcount > 1) {
		s.st.queries.Add(1)
		s.st.formerr.Add(1)
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// invalid counts messages miekg/dns could not parse (it answers FORMERR).
func (s *Server) invalid(m []byte, err error) {
	s.st.malformed.Add(1)
}

// ServeDNS implements dns.Handler. miekg/dns recovers no panic: one while
// answering a query ends that query (and its TCP connection), not the
// daemon.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	defer func() {
		if v := recover(); v != nil {
			s.panics.Report("dns query", v, "client", w.RemoteAddr().String())
			if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
				w.Close()
			}
		}
	}()
	ctx := context.Background()
	if p := s.base.Load(); p != nil {
		ctx = *p
	}
	network := "udp"
	var client netip.Addr
	switch a := w.RemoteAddr().(type) {
	case *net.UDPAddr:
		client = a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		client = a.AddrPort().Addr().Unmap()
		network = "tcp"
	}
	if resp := s.Handle(ctx, client, network, req); resp != nil {
		if err := w.WriteMsg(resp); err != nil {
			s.st.writeErrors.Add(1)
		}
	}
}

// counters are the live statistics; Stats snapshots them.
type counters struct {
	queries, allowed, blocked, rebinding, refused, formerr, malformed, healthcheck atomic.Uint64
	cacheHits, upstreamQueries, upstreamErrors, rateLimited, truncated, overloaded atomic.Uint64
	writeErrors                                                                    atomic.Uint64
}

// Stats is a snapshot of the filter's counters, served by `abox dns status`.
type Stats struct {
	Listen    string   `json:"listen"`
	Upstreams []string `json:"upstreams,omitempty"`
	// Queries counts every parsed query, including refused and rate-limited ones.
	Queries uint64 `json:"queries"`
	// Allowed counts answers given under an allow decision (healthcheck excluded).
	Allowed uint64 `json:"allowed"`
	// Blocked counts NXDOMAIN answers given by policy: not allowlisted,
	// invalid names, private reverse lookups and rebinding.
	Blocked uint64 `json:"blocked"`
	// RebindingBlocked is the part of Blocked due to a forbidden answer address.
	RebindingBlocked uint64 `json:"rebinding_blocked"`
	// Refused counts protocol refusals: opcodes, classes, zone transfers, meta types.
	Refused uint64 `json:"refused"`
	FormErr uint64 `json:"formerr"`
	// Malformed counts packets that could not be parsed at all.
	Malformed       uint64 `json:"malformed"`
	Healthcheck     uint64 `json:"healthcheck"`
	CacheHits       uint64 `json:"cache_hits"`
	CacheEntries    int    `json:"cache_entries"`
	UpstreamQueries uint64 `json:"upstream_queries"`
	UpstreamErrors  uint64 `json:"upstream_errors"`
	RateLimited     uint64 `json:"rate_limited"`
	// Overloaded counts queries answered SERVFAIL because MaxInflight upstream queries were pending.
	Overloaded uint64 `json:"overloaded"`
	// Truncated counts answers sent with TC set.
	Truncated   uint64 `json:"truncated"`
	WriteErrors uint64 `json:"write_errors"`
	// LogDropped counts decision log lines lost because the log sinks
	// stayed stuck (each loss is also reported in the log itself), and
	// LogWriteErrors failed writes to them.
	LogDropped     uint64 `json:"log_dropped"`
	LogWriteErrors uint64 `json:"log_write_errors"`
	// LogSuppressed counts refusal lines folded into "refusals aggregated"
	// lines, and LogError is the log's last write error (a full disk).
	LogSuppressed uint64 `json:"log_suppressed"`
	// TCPEvicted counts TCP connections closed, quietest first, to make
	// room for a new one at MaxTCPConns.
	TCPEvicted uint64 `json:"tcp_evicted"`
	// Panics counts panics recovered while answering one query or one
	// batch of datagrams: each ended that one only (the log has the stack).
	Panics   uint64 `json:"panics"`
	LogError string `json:"log_error,omitempty"`
}

// Stats implements daemon.Service.
func (s *Server) Stats() any { return s.Snapshot() }

// Snapshot returns the counters.
func (s *Server) Snapshot() Stats {
	st := Stats{
		Listen:           s.Addr().String(),
		Queries:          s.st.queries.Load(),
		Allowed:          s.st.allowed.Load(),
		Blocked:          s.st.blocked.Load(),
		RebindingBlocked: s.st.rebinding.Load(),
		Refused:          s.st.refused.Load(),
		FormErr:          s.st.formerr.Load(),
		Malformed:        s.st.malformed.Load(),
		Healthcheck:      s.st.healthcheck.Load(),
		CacheHits:        s.st.cacheHits.Load(),
		UpstreamQueries:  s.st.upstreamQueries.Load(),
		UpstreamErrors:   s.st.upstreamErrors.Load(),
		RateLimited:      s.st.rateLimited.Load(),
		Overloaded:       s.st.overloaded.Load(),
		Truncated:        s.st.truncated.Load(),
		WriteErrors:      s.st.writeErrors.Load(),
		Panics:           s.panics.Count(),
	}
	if s.cache != nil {
		st.CacheEntries = s.cache.len()
	}
	if s.tcp != nil {
		st.TCPEvicted = s.tcp.evicted.Load()
	}
	if s.dlog != nil {
		ls := s.dlog.Stats()
		st.LogDropped, st.LogWriteErrors = ls.Dropped, ls.WriteErrors
		st.LogSuppressed, st.LogError = ls.Suppressed, ls.LastError
	}
	if u, ok := s.up.(interface{ Servers() []string }); ok {
		st.Upstreams = u.Servers()
	}
	return st
}

// typeString names a query type for logs.
func typeString(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + fmt.Sprint(t)
}
