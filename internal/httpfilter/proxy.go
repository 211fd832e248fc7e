// Package httpfilter is the per-instance HTTP/HTTPS filtering proxy: an
// explicit forward proxy for absolute-form HTTP and CONNECT that intercepts
// TLS with the instance CA, applies the allowlist to every request, and
// reaches only addresses the egress guard has checked.
package httpfilter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/connio"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// Config configures a Proxy. Durations of 0 take the documented default.
type Config struct {
	// Listener is bound by the caller (daemon readiness means "bound").
	Listener net.Listener
	// Metrics, when not nil, counts the decisions (NewMetrics, metrics.go).
	Metrics *Metrics
	// Policy decides names (healthcheck, allowlist, passive mode).
	Policy *policy.Engine
	// Resolver resolves allowlisted names once per decision.
	Resolver egress.Resolver
	// Addresses classifies destination addresses: permitted ranges
	// (--allow-private) and the host's own addresses.
	Addresses *netclass.Policy
	// Dialer opens upstream connections; nil means a net.Dialer.
	Dialer egress.Dialer
	// Ports are the destination ports allowed; empty means 80 and 443.
	Ports []uint16
	// CA mints interception certificates. Required: even with NoMITM the
	// healthcheck is answered over TLS by the proxy itself.
	CA *ca.CA
	// NoMITM tunnels every CONNECT after checking the ClientHello's SNI.
	NoMITM bool
	// MITMExceptions are names tunnelled instead of intercepted. An entry
	// with request rules on a host that NoMITM or an exception tunnels is
	// an error (Tunnelled.Check); give the Policy's engine the same check.
	MITMExceptions []string
	// UpstreamRoots verify upstream servers; nil means the system roots.
	UpstreamRoots *x509.CertPool
	// KeyLogPath is where SetKeyLog(true) writes NSS key log lines.
	KeyLogPath string
	// Secrets, when set, is the instance's secrets: on every intercepted
	// request that passed every other check, bound headers are set from
	// the values and a placeholder anywhere else is refused (secrets.go).
	// Nil: no secret is injected and placeholders are not looked for.
	Secrets SecretSource
	// KeyLogMaxBytes caps the key log file (what it held before counts);
	// 0 means DefaultKeyLogMaxBytes. Past it keys are no longer written.
	KeyLogMaxBytes int64
	// DecisionLog receives one JSON line per request or tunnel; nil discards.
	DecisionLog *slog.Logger
	// Decisions, when set, takes the decision lines instead of DecisionLog:
	// the same lines (fields, order, encoding), built by decisionlog's
	// append encoder instead of log/slog. Point DecisionLog's handler at
	// the same Writer for the rarer lines that still use slog.
	Decisions *decisionlog.Writer
	// Logger receives diagnostics; nil discards.
	Logger *slog.Logger
	// MaxConns caps concurrent client connections; 0 means 1024.
	MaxConns int
	// IdleTimeout closes a connection (either side) on which no byte moved
	// for this long; there is no overall deadline. 0 means 10 minutes.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds reading a request header, a ClientHello and
	// TLS handshakes on both sides; 0 means 30s.
	HandshakeTimeout time.Duration
	// DialTimeout bounds each upstream connection attempt; 0 means 10s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds waiting for an upstream response header;
	// 0 means 5 minutes (slow APIs think before they answer).
	ResponseHeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request header block; 0 means 64 KiB.
	MaxHeaderBytes int
	// ShutdownTimeout bounds a graceful shutdown; 0 means 5s.
	ShutdownTimeout time.Duration
	// RequestRate is the requests per second (plain, CONNECT and
	// intercepted alike) each guest address may send, RequestBurst its
	// bucket; 0 means DefaultRequestRate/DefaultRequestBurst, a negative
	// RequestRate disables the limit. Over it: 429 rate_limited.
	RequestRate  float64
	RequestBurst int
	// MaxUpstream bounds the requests forwarded upstream at once, for the
	// whole proxy (0: DefaultMaxUpstream); a request that finds no slot
	// within UpstreamWait (0: DefaultUpstreamWait) gets 503 upstream_busy.
	MaxUpstream  int
	UpstreamWait time.Duration
}

// Proxy is the filtering proxy. Create it with New and run it with Serve.
type Proxy struct {
	cfg       Config
	guard     *egress.Guard
	ports     map[uint16]bool
	tunnelled Tunnelled // hosts carried as byte tunnels
	dlog      *slog.Logger
	lines     *decisionlog.Writer // nil: decision lines go through dlog
	log       *slog.Logger

	transport *http.Transport // WebSocket upgrades only
	pool      *upstreamPool   // HTTP/1.1 and HTTP/2 connections to origins
	upTLS     *tls.Config     // verifies origins; a copy per dial names the server
	h2t       *http2.Transport
	rp        *httputil.ReverseProxy
	h2        *http2.Server
	inner     *http.Server // the base configuration of intercepted HTTP/2 connections
	keylog    *keyLog
	// secretsErr is the last secrets policy error reported (a string).
	secretsErr atomic.Value

	stats  stats
	limits limits

	connsMu sync.Mutex
	conns   map[*connio.IdleConn]struct{} // every open client connection, for shutdown

	// srv serves the guest's HTTP/1.x connections (plain and intercepted)
	// and closes the idle ones at shutdown.
	srv h1.Server

	live liveSet // connections held for a target, re-checked on policy changes

	// panics reports panics recovered while serving one connection or
	// request (see internal/contain).
	panics *contain.Reporter
}

// Reason codes of the proxy besides those of allowlist, policy, egress and
// the address classes.
const (
	ReasonPortNotAllowed  = "port_not_allowed"
	ReasonInvalidTarget   = "invalid_target"
	ReasonNotProxyRequest = "not_proxy_request"
	ReasonDomainFronting  = "domain_fronting"
	ReasonSNIMismatch     = "sni_mismatch"
	ReasonSNIMissing      = "sni_missing"
	ReasonNotTLS          = "not_tls"
	ReasonConnectInTunnel = "connect_in_tunnel"
	ReasonH2CUpgrade      = "h2c_upgrade"
	ReasonUpgradeRefused  = "upgrade_not_supported"
	// Requests the server loop refuses before any handler sees them.
	ReasonMalformedRequest = h1.ReasonMalformedRequest
	ReasonHTTPVersion      = h1.ReasonHTTPVersion
	ReasonMissingHost      = h1.ReasonMissingHost
	ReasonMalformedHost    = h1.ReasonMalformedHost
	ReasonExpectation      = h1.ReasonExpectation
	// The guest's request body broke before the origin's answer was read.
	ReasonBodyCut         = "request_body_cut"
	ReasonTooManyConns    = "too_many_connections"
	ReasonUpstreamConnect = "upstream_connect_failed"
	ReasonUpstreamTLS     = "upstream_tls_failed"
	ReasonUpstreamTimeout = "upstream_timeout"
	ReasonUpstreamError   = "upstream_error"
	ReasonClientHandshake = "client_tls_failed"
	ReasonUserinfo        = "userinfo_in_target"
	ReasonHTTPSInAbsolute = "https_needs_connect"
)

// h2UploadWindow is the flow-control window the guest's intercepted HTTP/2
// connections get, per connection and per stream: what a guest can make the
// proxy hold of request bodies nobody reads yet (an origin that reads
// slowly). x/net's default, 1 MiB, is a GiB over the connection limit; a
// quarter of it still fills a link whose round trip is a millisecond at
// 250 MB/s.
const h2UploadWindow = 256 << 10

// New validates cfg and builds a proxy; nothing is served until Serve.
func New(cfg Config) (*Proxy, error) {
	if cfg.Listener == nil {
		return nil, errors.New("creating http filter: no listener")
	}
	if cfg.Policy == nil {
		return nil, errors.New("creating http filter: no policy")
	}
	if cfg.CA == nil {
		return nil, errors.New("creating http filter: no certificate authority")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.IdleTimeout, 10*time.Minute)
	def(&cfg.HandshakeTimeout, 30*time.Second)
	def(&cfg.DialTimeout, 10*time.Second)
	def(&cfg.ResponseHeaderTimeout, 5*time.Minute)
	def(&cfg.ShutdownTimeout, 5*time.Second)
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 1024
	}
	if cfg.MaxHeaderBytes <= 0 {
		cfg.MaxHeaderBytes = 64 << 10
	}
	if len(cfg.Ports) == 0 {
		cfg.Ports = []uint16{80, 443}
	}
	p := &Proxy{
		cfg:    cfg,
		guard:  &egress.Guard{Resolver: cfg.Resolver, Policy: cfg.Addresses, Dialer: cfg.Dialer, DialTimeout: cfg.DialTimeout},
		ports:  map[uint16]bool{},
		dlog:   cfg.DecisionLog,
		lines:  cfg.Decisions,
		log:    cfg.Logger,
		conns:  map[*connio.IdleConn]struct{}{},
		limits: newLimits(cfg),
	}
	p.stats.blocked = map[string]uint64{}
	if p.dlog == nil {
		p.dlog = slog.New(slog.DiscardHandler)
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.panics = contain.New(p.log)
	p.srv.HeaderTimeout, p.srv.Panics = p.cfg.HandshakeTimeout, p.panics
	p.keylog = &keyLog{path: cfg.KeyLogPath, max: cfg.KeyLogMaxBytes, log: p.log}
	for _, port := range cfg.Ports {
		p.ports[port] = true
	}
	tun, err := NewTunnelled(cfg.NoMITM, cfg.MITMExceptions)
	if err != nil {
		return nil, fmt.Errorf("creating http filter: %w", err)
	}
	p.tunnelled = tun
	// The daemon gives the policy engine the same check (policy.Config's
	// Check), which keeps such a list out of force on reload as well.
	if err := tun.Check(cfg.Policy.List()); err != nil {
		return nil, fmt.Errorf("creating http filter: %w", err)
	}
	roots := cfg.UpstreamRoots
	if roots == nil {
		sys, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("creating http filter: loading system roots: %w", err)
		}
		roots = sys
	}
	p.transport = &http.Transport{
		Proxy:                  nil,
		DialContext:            p.dialUpstream,
		TLSClientConfig:        &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:      true,
		TLSHandshakeTimeout:    cfg.HandshakeTimeout,
		ResponseHeaderTimeout:  cfg.ResponseHeaderTimeout,
		ExpectContinueTimeout:  time.Second,
		IdleConnTimeout:        90 * time.Second,
		MaxIdleConns:           512,
		MaxIdleConnsPerHost:    64,
		MaxResponseHeaderBytes: 1 << 20,
		// The guest chose its encodings; transparent decompression would
		// change the bytes it receives.
		DisableCompression: true,
	}
	p.upTLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	p.pool = newUpstreamPool()
	h2base := p.transport.Clone()
	h2t, err := http2.ConfigureTransports(h2base)
	if err != nil {
		return nil, fmt.Errorf("creating http filter: %w", err)
	}
	// The transport pools by name, not by checked address: an upgrade the
	// origin declined must not leave a connection for the next upgrade of
	// that name, whose own decision may have checked other addresses.
	p.transport.DisableKeepAlives = true
	p.h2t = h2t
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: upstreamRT{p},
		// 0: ReverseProxy itself flushes every write of SSE and of bodies of
		// unknown length (streams, long polls); known lengths are buffered.
		FlushInterval: 0,
		ErrorHandler:  p.upstreamError,
		ErrorLog:      log.New(io.Discard, "", 0),
		BufferPool:    connio.BufferPool{},
	}
	p.h2 = &http2.Server{IdleTimeout: cfg.IdleTimeout, MaxConcurrentStreams: 250,
		MaxUploadBufferPerConnection: h2UploadWindow, MaxUploadBufferPerStream: h2UploadWindow}
	p.inner = &http.Server{
		ReadHeaderTimeout: cfg.HandshakeTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnContext:       withClient,
	}
	return p, nil
}

// withClient charges what a connection's requests cost (name lookups) to
// the guest at its remote address.
func withClient(ctx context.Context, c net.Conn) context.Context {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return egress.WithClient(ctx, ap.Addr())
	}
	return ctx
}

// Name implements daemon.Service.
func (p *Proxy) Name() string { return "http" }

// Addr is the listening address.
func (p *Proxy) Addr() net.Addr { return p.cfg.Listener.Addr() }

// Serve runs the proxy until ctx ends, then shuts down within
// ShutdownTimeout, closing tunnels that are still open. HTTP/1.x is served
// by the engine in internal/httpfilter/h1.
func (p *Proxy) Serve(ctx context.Context) error {
	ln := &limitListener{Listener: p.cfg.Listener, p: p, sem: make(chan struct{}, p.cfg.MaxConns)}
	// The policy watched for changes is the one in force before the first
	// connection is accepted: a change after any decision is seen.
	list, mode := p.cfg.Policy.List(), p.cfg.Policy.Mode()
	errc := make(chan error, 1)
	go func() { errc <- p.acceptLoop(ctx, ln) }()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go p.watchPolicy(wctx, list, mode)
	select {
	case err := <-errc:
		p.shutdown(ln)
		return fmt.Errorf("serving http filter: %w", err)
	case <-ctx.Done():
	}
	p.shutdown(ln)
	<-errc
	return nil
}

// shutdown stops accepting, closes connections waiting for a request and
// gives those serving one ShutdownTimeout to finish; then it closes every
// connection left, tunnels included.
func (p *Proxy) shutdown(ln net.Listener) {
	p.srv.Shutdown()
	ln.Close()
	deadline := time.Now().Add(p.cfg.ShutdownTimeout)
	for p.srv.CloseIdle() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	p.connsMu.Lock()
	open := make([]*connio.IdleConn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.connsMu.Unlock()
	for _, c := range open {
		c.Close()
	}
	p.transport.CloseIdleConnections()
	p.pool.CloseIdle()
	p.keylog.set(false)
}

// track wraps an accepted connection: idle timeout, byte counts, and
// registration for shutdown. release frees the connection slot.
func (p *Proxy) track(c net.Conn, release func()) net.Conn {
	p.stats.connsOpen.Add(1)
	var ic *connio.IdleConn
	ic = connio.NewIdleConn(c, p.cfg.IdleTimeout, func() {
		p.connsMu.Lock()
		delete(p.conns, ic)
		p.connsMu.Unlock()
		p.stats.connsOpen.Add(-1)
		p.stats.bytesFromClients.Add(uint64(ic.Received()))
		p.stats.bytesToClients.Add(uint64(ic.Sent()))
		release()
	})
	p.connsMu.Lock()
	p.conns[ic] = struct{}{}
	p.connsMu.Unlock()
	g := connio.NewH1Guard(ic, p.cfg.MaxHeaderBytes, func(reason string) { p.guardRefused(c.RemoteAddr().String(), "", reason) })
	g.CountBulk(&p.stats.bulkBodies)
	return g
}

// guardRefused logs and counts a request the h1 guard refused before it
// was parsed, or the server loop refused before any handler saw it.
func (p *Proxy) guardRefused(client, connect, reason string) {
	rec := &record{start: time.Now(), kind: "http", client: client, connect: connect,
		verdict: allowlist.Block, reason: reason, denialID: newDenialID()}
	// Written by the deferred finish, as every request's line is (see
	// TestEveryLineIsOneDeferredFinish).
	defer p.finish(rec)
	rec.status = 400
	switch reason {
	case "headers_too_large", ReasonFieldTooLarge:
		rec.status = 431
	case ReasonURITooLong:
		rec.status = 414
	case "unsupported_transfer_encoding":
		rec.status = 501
	case ReasonHTTPVersion:
		rec.status = 505
	case ReasonExpectation:
		rec.status = 417
	case ReasonTooManyConns:
		rec.status = 503
	}
}

// upstreamRT sends ReverseProxy's requests (WebSocket upgrades) through the
// Transport, whose only dialer is dialUpstream.
type upstreamRT struct{ p *Proxy }

func (t upstreamRT) RoundTrip(r *http.Request) (*http.Response, error) {
	return t.p.transport.RoundTrip(r)
}

// SetKeyLog switches the TLS key log of intercepted client sessions on or
// off (api.KeyLogger).
func (p *Proxy) SetKeyLog(on bool) error { return p.keylog.set(on) }

// KeyLogPath is where the key log is written.
func (p *Proxy) KeyLogPath() string { return p.cfg.KeyLogPath }

// KeyLogStopped is why the key log, switched on, writes no more keys (its
// cap, a failed write), or "".
func (p *Proxy) KeyLogStopped() string {
	p.keylog.mu.Lock()
	defer p.keylog.mu.Unlock()
	return p.keylog.stopped
}

// SetKeyLogSecretSessions opts the key log, while it is on, into the keys
// of sessions that carried an injected secret (off by default; switching
// the key log off clears it).
func (p *Proxy) SetKeyLogSecretSessions(on bool) error {
	p.keylog.mu.Lock()
	defer p.keylog.mu.Unlock()
	if on && p.keylog.f == nil {
		return errors.New("writing the keys of secret sessions: the key log is off (abox tap turns it on)")
	}
	p.keylog.secrets = on
	return nil
}

// KeyLogSecretSessions reports whether the key log takes the keys of
// sessions that carried an injected secret.
func (p *Proxy) KeyLogSecretSessions() bool {
	_, s := p.keylog.state()
	return s
}

// KeyLogWithheld counts the sessions whose keys were left out of the key
// log because they carried an injected secret, since the proxy started.
func (p *Proxy) KeyLogWithheld() uint64 { return p.keylog.withheld.Load() }

// KeyLogEnabled reports whether key logging is on.
func (p *Proxy) KeyLogEnabled() bool {
	p.keylog.mu.Lock()
	defer p.keylog.mu.Unlock()
	return p.keylog.f != nil
}

// stats holds the counters behind Stats.
type stats struct {
	requests, allowed, healthchecks, upstreamErrors   atomic.Uint64
	tunnels, intercepted, connsRefused, upstreamDials atomic.Uint64
	bytesFromClients, bytesToClients                  atomic.Uint64
	tunnelsOpen, connsOpen                            atomic.Int64
	// policyChanges counts the allowlist or mode changes whose revocation
	// pass has run.
	policyChanges atomic.Uint64
	// bulkBodies counts plain-HTTP response bodies relayed straight
	// between the connections (connio.H1Guard.ReadFrom).
	bulkBodies atomic.Uint64
	mu         sync.Mutex
	blocked    map[string]uint64
}

// Stats is the JSON snapshot served by the local API (abox http status).
type Stats struct {
	Requests        uint64            `json:"requests"`
	Allowed         uint64            `json:"allowed"`
	Blocked         uint64            `json:"blocked"`
	BlockedByReason map[string]uint64 `json:"blocked_by_reason"`
	Healthchecks    uint64            `json:"healthchecks"`
	UpstreamErrors  uint64            `json:"upstream_errors"`
	UpstreamDials   uint64            `json:"upstream_connections"`
	// UpstreamH2Evicted counts idle shared HTTP/2 connections to origins
	// closed to make room for a new one (at most 256 are kept).
	UpstreamH2Evicted uint64 `json:"upstream_h2_evicted"`
	Tunnels           uint64 `json:"tunnels"`
	Intercepted       uint64 `json:"intercepted"`
	TunnelsOpen       int64  `json:"tunnels_open"`
	ConnsOpen         int64  `json:"connections_open"`
	ConnsRefused      uint64 `json:"connections_refused"`
	MaxConns          int    `json:"connections_max"`
	BytesFromGuest    uint64 `json:"bytes_from_guest"`
	BytesToGuest      uint64 `json:"bytes_to_guest"`
	KeyLog            bool   `json:"keylog"`
	KeyLogStopped     string `json:"keylog_stopped,omitempty"`
	// KeyLogWithheld counts sessions whose keys were left out of the key
	// log: they carried an injected secret.
	KeyLogWithheld uint64 `json:"keylog_withheld"`
	CertsCached    int    `json:"certs_cached"`
	Listen         string `json:"listen"`
	// Panics counts panics recovered while serving one connection or
	// request: each ended that one only (the daemon's log has the stack).
	Panics uint64 `json:"panics"`
	// Log is the decision log's state (lines, drops, refusals aggregated,
	// the last write error such as a full disk); nil without Decisions.
	Log *decisionlog.Stats `json:"log,omitempty"`
}

// Stats implements api.Component. Byte counts include closed connections only.
func (p *Proxy) Stats() any {
	s := Stats{
		Requests:          p.stats.requests.Load(),
		Allowed:           p.stats.allowed.Load(),
		Healthchecks:      p.stats.healthchecks.Load(),
		UpstreamErrors:    p.stats.upstreamErrors.Load(),
		UpstreamDials:     p.stats.upstreamDials.Load(),
		UpstreamH2Evicted: p.pool.H2Evicted(),
		Tunnels:           p.stats.tunnels.Load(),
		Intercepted:       p.stats.intercepted.Load(),
		TunnelsOpen:       p.stats.tunnelsOpen.Load(),
		ConnsOpen:         p.stats.connsOpen.Load(),
		ConnsRefused:      p.stats.connsRefused.Load(),
		MaxConns:          p.cfg.MaxConns,
		BytesFromGuest:    p.stats.bytesFromClients.Load(),
		BytesToGuest:      p.stats.bytesToClients.Load(),
		KeyLog:            p.KeyLogEnabled(),
		KeyLogStopped:     p.KeyLogStopped(),
		KeyLogWithheld:    p.KeyLogWithheld(),
		CertsCached:       p.cfg.CA.CachedLeaves(),
		Listen:            p.Addr().String(),
		Panics:            p.panics.Count(),
	}
	if p.lines != nil {
		ls := p.lines.Stats()
		s.Log = &ls
	}
	p.stats.mu.Lock()
	s.BlockedByReason = make(map[string]uint64, len(p.stats.blocked))
	for k, v := range p.stats.blocked {
		s.BlockedByReason[k] = v
		s.Blocked += v
	}
	p.stats.mu.Unlock()
	return s
}

func (p *Proxy) countBlock(reason string) {
	p.stats.mu.Lock()
	p.stats.blocked[reason]++
	p.stats.mu.Unlock()
}
