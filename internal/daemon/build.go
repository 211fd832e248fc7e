package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/audit"
	"github.com/abox-dev/abox/internal/budget"
	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/contain"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/resolver"
	"github.com/abox-dev/abox/internal/secrets"
	"github.com/abox-dev/abox/internal/upstream"
)

// ErrConfig marks a Config the caller got wrong (a bad flag), as opposed to
// the machine refusing (a port in use, a missing file).
var ErrConfig = errors.New("invalid data plane configuration")

// ErrAllowlist marks an allowlist file that does not load; the error names
// the bad lines.
var ErrAllowlist = errors.New("allowlist rejected")

// ErrListen marks a listening address that cannot be bound (in use, not an
// address of this host, a bad address).
var ErrListen = errors.New("cannot listen")

// listenError carries ErrListen without changing the message.
type listenError struct{ err error }

func (e listenError) Error() string        { return e.err.Error() }
func (e listenError) Unwrap() error        { return e.err }
func (e listenError) Is(target error) bool { return target == ErrListen }

// atLeastTwoPs runs the process with at least two Ps (GOMAXPROCS) unless
// the environment sets GOMAXPROCS: the DNS filter's UDP reader waits in a
// system call holding a P (see dnsfilter's blockingConn), and on a host
// or cgroup of one CPU a second P keeps the rest of the daemon running
// meanwhile. With one P the filter stays in Go's poller instead.
func atLeastTwoPs() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
}

// Run builds the data plane cfg describes (logs, policy, resolver, the
// filters, CA and local API), serves until ctx ends or a part fails, and
// then takes everything down in the reverse order it was built.
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if cfg.DNS != nil {
		atLeastTwoPs()
	}
	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	var b builder
	defer b.closeAll()
	opts, info, err := b.build(cfg)
	if err != nil {
		return err
	}
	opts.Ready = func() {
		if cfg.Ready != nil {
			cfg.Ready(info)
		}
	}
	return serve(ctx, opts)
}

func (cfg *Config) check() error {
	switch {
	case cfg.Instance == "":
		return fmt.Errorf("%w: no instance name", ErrConfig)
	case cfg.AllowlistPath == "":
		return fmt.Errorf("%w: no allowlist file", ErrConfig)
	case cfg.APISocket == "":
		return fmt.Errorf("%w: no API socket", ErrConfig)
	case cfg.DNS == nil && cfg.HTTP == nil:
		return fmt.Errorf("%w: neither the DNS filter nor the proxy is on", ErrConfig)
	case cfg.HTTP != nil && cfg.HTTP.CADir == "":
		return fmt.Errorf("%w: the proxy needs a CA directory", ErrConfig)
	}
	if cfg.MetricsListen != "" {
		if _, err := ParseMetricsListen(cfg.MetricsListen); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	if d := cfg.DNS; d != nil {
		lo, hi := or(d.MinTTL, DefaultMinTTL), or(d.MaxTTL, DefaultMaxTTL)
		if lo < time.Second || hi < lo {
			return fmt.Errorf("%w: TTL floor %s and ceiling %s: want 1s <= floor <= ceiling", ErrConfig, lo, hi)
		}
	}
	for _, u := range cfg.Upstreams {
		if _, err := upstream.ParseServer(u); err != nil {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
	}
	return nil
}

func or[T int | float64 | time.Duration](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

// builder remembers what was built so it can be undone in reverse.
type builder struct {
	undo []func()
	// audit is the instance's audit stream, nil for none; every decision
	// stream's writer feeds it.
	audit *audit.Stream
}

func (b *builder) onClose(f func()) { b.undo = append(b.undo, f) }

func (b *builder) closeAll() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
}

// decisionStream is one filter's decision log: the writer the filter
// encodes into, the ring the API serves, and the ring of its refusal
// stream (every line but allowed decisions).
type decisionStream struct {
	w        *decisionlog.Writer
	ring     *logring.Ring
	refusals *logring.Ring
}

func (b *builder) stream(lc LogConfig, file string) (decisionStream, error) {
	ring := logring.New(or(lc.RingLines, 2000))
	refusals := logring.New(or(lc.RingLines, 2000))
	out := lc.Stream
	var keptOut io.Writer = io.Discard
	if lc.streamRefusals != nil {
		keptOut = lc.streamRefusals
	}
	if file != "" {
		// Size-capped and rotated: a guest cannot fill the disk through
		// them. The refusal stream has a file of its own, so that the
		// guest's allowed traffic cannot rotate a refusal away.
		fc := decisionlog.FileConfig{MaxMB: lc.FileMaxMB}
		f, err := decisionlog.OpenFile(file, fc)
		if err != nil {
			return decisionStream{}, err
		}
		b.onClose(func() { f.Close() })
		kf, err := decisionlog.OpenFile(decisionlog.RefusalsPath(file), fc)
		if err != nil {
			return decisionStream{}, err
		}
		b.onClose(func() { kf.Close() })
		out, keptOut = f, kf
	}
	if out == nil {
		out = io.Discard
	}
	sinks := []io.Writer{out, ring}
	if b.audit != nil {
		// Allowed and refused alike, after the flood budget has folded a
		// guest's floods: the guest cannot grow it faster than its logs.
		sinks = append(sinks, b.audit)
	}
	w := decisionlog.New(decisionlog.Config{Sinks: sinks, Kept: []io.Writer{keptOut, refusals}})
	b.onClose(func() { w.Close() }) // flushed before its files close
	return decisionStream{w: w, ring: ring, refusals: refusals}, nil
}

// openStreamFile opens lc.StreamFile as lc's Stream and its refusal
// stream, once for both filters.
func (b *builder) openStreamFile(lc *LogConfig) error {
	if lc.StreamFile == "" {
		return nil
	}
	f, err := decisionlog.OpenFile(lc.StreamFile, decisionlog.FileConfig{MaxMB: lc.FileMaxMB})
	if err != nil {
		return err
	}
	b.onClose(func() { f.Close() })
	kf, err := decisionlog.OpenFile(decisionlog.RefusalsPath(lc.StreamFile), decisionlog.FileConfig{MaxMB: lc.FileMaxMB})
	if err != nil {
		return err
	}
	b.onClose(func() { kf.Close() })
	lc.Stream, lc.streamRefusals = f, kf
	return nil
}

func (b *builder) build(cfg Config) (Options, Info, error) {
	// Opened first, closed last: the decision writers flush into it.
	if err := b.openAudit(cfg); err != nil {
		return Options{}, Info{}, err
	}
	if err := b.openStreamFile(&cfg.Logs); err != nil {
		return Options{}, Info{}, err
	}
	var (
		info  Info
		svcs  []Service
		logs  = map[string]*logring.Ring{}
		dns   decisionStream
		httpd decisionStream
		err   error
	)
	reg := newRegistry(cfg)
	mln, err := listenMetrics(cfg.MetricsListen)
	if err != nil {
		return Options{}, info, err
	}
	if mln != nil {
		b.onClose(func() { mln.Close() })
		info.MetricsAddr = mln.Addr()
	}
	if cfg.DNS != nil {
		if dns, err = b.stream(cfg.Logs, cfg.Logs.DNSFile); err != nil {
			return Options{}, info, err
		}
		logs["dns"], logs["dns"+RefusalsSuffix] = dns.ring, dns.refusals
	}
	if cfg.HTTP != nil {
		if httpd, err = b.stream(cfg.Logs, cfg.Logs.HTTPFile); err != nil {
			return Options{}, info, err
		}
		logs["http"], logs["http"+RefusalsSuffix] = httpd.ring, httpd.refusals
	}
	// Diagnostics: into the decision stream when there is one stream, to
	// Diag when each filter has its own file.
	var diag io.Writer = io.Discard
	switch {
	case cfg.Logs.DNSFile != "" || cfg.Logs.HTTPFile != "":
		if cfg.Logs.Diag != nil {
			diag = cfg.Logs.Diag
		}
	case dns.w != nil:
		diag = dns.w
	default:
		diag = httpd.w
	}
	log := slog.New(slog.NewJSONHandler(diag, nil))

	pcfg := policy.Config{AllowlistPath: cfg.AllowlistPath, Logger: log}
	if h := cfg.HTTP; h != nil {
		// Request rules on a host the proxy tunnels could not be enforced:
		// such a list is refused at start, on reload and on every edit.
		tun, err := httpfilter.NewTunnelled(h.NoMITM, h.MITMExceptions)
		if err != nil {
			return Options{}, info, fmt.Errorf("%w: %w", ErrConfig, err)
		}
		pcfg.Check = tun.Check
	}
	if b.audit != nil {
		pcfg.OnChange = func(c policy.Change) {
			if err := b.audit.Append(audit.KindPolicy, c); err != nil {
				log.Error("audit: recording a policy change", "error", err.Error())
			}
		}
	}
	pol, err := policy.New(pcfg)
	if err != nil {
		return Options{}, info, fmt.Errorf("%w: %w", ErrAllowlist, err)
	}
	if cfg.Passive {
		pol.SetMode(policy.Passive)
	}
	if b.audit != nil {
		if err := b.audit.Append(audit.KindFilters, filtersStarted{Restarts: cfg.Restarts, Mode: string(pol.Mode()), Allowlist: policy.ListHash(pol.List())}); err != nil {
			return Options{}, info, err
		}
	}
	info.Mode = string(pol.Mode())
	host, err := netclass.HostAddrs()
	if err != nil {
		return Options{}, info, err
	}
	host = append(host, cfg.HostAddrs...)
	up, err := upstream.New(upstream.Config{Servers: cfg.Upstreams, Timeout: cfg.UpstreamTimeout})
	if err != nil {
		return Options{}, info, err
	}
	info.Upstreams = up.Servers()
	// One resolver for both filters, with the DNS filter's TTL bounds: a
	// name the guest resolved costs the proxy no second lookup.
	rc := resolver.Config{Upstream: up, Panics: contain.New(log)}
	// One budget per guest for its DNS queries and the proxy's lookups on
	// its behalf, so the proxy is no way around the DNS rate limit.
	rate, burst := float64(DefaultRateLimit), DefaultRateBurst
	if d := cfg.DNS; d != nil {
		rate, burst = or(d.RateLimit, rate), or(d.RateBurst, burst)
	}
	var bud *budget.Limiter
	if rate > 0 {
		bud = budget.New(rate, burst, dnsfilter.DefaultRateClients)
	}
	rc.Budget = bud
	if d := cfg.DNS; d != nil {
		rc.MinTTL, rc.MaxTTL = d.MinTTL, d.MaxTTL
		if d.CacheSize < 0 {
			rc.Entries = -1
		} else {
			rc.Entries = d.CacheSize
		}
	}
	res, err := resolver.New(rc)
	if err != nil {
		return Options{}, info, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// The host network's NAT64 prefixes, shared by both address policies.
	nat64 := new(netclass.NAT64)
	nctx, stopNAT64 := context.WithCancel(context.Background())
	nat64Done := make(chan struct{})
	go func() {
		defer close(nat64Done)
		discoverNAT64(nctx, res, nat64, log)
	}()
	b.onClose(func() {
		stopNAT64()
		<-nat64Done
	})

	if d := cfg.DNS; d != nil {
		pc, ln := d.PacketConn, d.Listener
		if pc == nil && ln == nil {
			if pc, ln, err = dnsfilter.Listen(d.Listen); err != nil {
				return Options{}, info, listenError{err}
			}
		}
		b.onClose(func() {
			if pc != nil {
				pc.Close()
			}
			if ln != nil {
				ln.Close()
			}
		})
		srv, err := dnsfilter.New(dnsfilter.Config{
			PacketConn: pc, Listener: ln,
			Policy: pol, Upstream: res,
			Addrs:  netclass.New(netclass.Options{Permit: cfg.AllowPrivate, PermitHost: cfg.AllowHost, Host: host, NAT64: nat64}),
			Logger: slog.New(slog.NewJSONHandler(dns.w, nil)), DecisionLog: dns.w,
			MinTTL: d.MinTTL, MaxTTL: d.MaxTTL,
			CacheSize: d.CacheSize, RateLimit: d.RateLimit, RateBurst: d.RateBurst, Budget: bud,
			Metrics: reg,
		})
		if err != nil {
			return Options{}, info, err
		}
		info.DNSAddr = srv.Addr()
		svcs = append(svcs, srv)
	}
	var keylog *httpfilter.Proxy
	if h := cfg.HTTP; h != nil {
		authority, err := ca.New(ca.Config{Dir: h.CADir, Name: cfg.Instance})
		if err != nil {
			return Options{}, info, err
		}
		// Create the CA now, not at the first CONNECT: the guest must be
		// able to trust ca.crt before its first connection.
		if _, err := authority.CertPEM(); err != nil {
			return Options{}, info, err
		}
		info.CACert = filepath.Join(h.CADir, ca.CertFile)
		roots, err := ca.UpstreamRoots(h.UpstreamCA)
		if err != nil {
			return Options{}, info, err
		}
		// With a parent proxy the guard's checked addresses are dialled
		// through it; without one, directly.
		var dialer egress.Dialer
		if h.UpstreamProxy != "" {
			pp, err := egress.NewParentProxy(h.UpstreamProxy, h.UpstreamProxyCredentials)
			if err != nil {
				return Options{}, info, err
			}
			dialer = pp
		}
		phost := host
		ln := h.Listener
		if ln == nil {
			ap, err := netip.ParseAddrPort(h.Listen)
			if err != nil {
				return Options{}, info, listenError{fmt.Errorf("proxy address %q: want IP:PORT (for example 10.10.10.1:3128)", h.Listen)}
			}
			if ln, err = net.Listen("tcp", ap.String()); err != nil {
				return Options{}, info, listenError{fmt.Errorf("proxy: %w", err)}
			}
		}
		b.onClose(func() { ln.Close() })
		// The proxy's own address is the gateway the guest sees: never a
		// destination.
		if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil && !ap.Addr().IsUnspecified() {
			phost = append(append([]netip.Addr(nil), host...), ap.Addr().Unmap())
		}
		var secretSrc httpfilter.SecretSource // a nil *secrets.Source would not be a nil interface
		if h.SecretsDir != "" {
			secretSrc = secrets.Open(h.SecretsDir).Source(cfg.Instance)
		}
		proxy, err := httpfilter.New(httpfilter.Config{
			Listener:       ln,
			Policy:         pol,
			Resolver:       res,
			Addresses:      netclass.New(netclass.Options{Permit: cfg.AllowPrivate, PermitHost: cfg.AllowHost, Host: phost, NAT64: nat64}),
			Ports:          h.Ports,
			CA:             authority,
			NoMITM:         h.NoMITM,
			MITMExceptions: h.MITMExceptions,
			UpstreamRoots:  roots,
			Dialer:         dialer,
			KeyLogPath:     h.KeyLogPath,
			Secrets:        secretSrc,
			Decisions:      httpd.w,
			Logger:         log,
			MaxConns:       or(h.MaxConns, DefaultMaxConns),
			IdleTimeout:    or(h.IdleTimeout, DefaultIdleTimeout),
			RequestRate:    h.RateLimit,
			RequestBurst:   h.RateBurst,
			MaxUpstream:    h.MaxUpstream,
			Metrics:        httpfilter.NewMetrics(reg),
		})
		if err != nil {
			return Options{}, info, err
		}
		info.HTTPAddr = proxy.Addr()
		svcs = append(svcs, proxy)
		caps, err := b.capture(proxy, h)
		if err != nil {
			return Options{}, info, err
		}
		svcs = append(svcs, caps...)
		keylog = proxy
	}
	o := Options{
		Instance:        cfg.Instance,
		Policy:          pol,
		Services:        svcs,
		Logs:            logs,
		APISocket:       cfg.APISocket,
		Logger:          log,
		Extra:           []api.Component{resolverComponent{res}},
		Metrics:         reg,
		MetricsListener: mln,
	}
	if keylog != nil {
		o.KeyLog = keylog
	}
	return o, info, nil
}

// capture builds the capture servers of h, if it has them.
func (b *builder) capture(proxy *httpfilter.Proxy, h *HTTPConfig) ([]Service, error) {
	on := [2]bool{h.CaptureHTTP != "" || h.CaptureHTTPListener != nil, h.CaptureTLS != "" || h.CaptureTLSListener != nil}
	if on[0] != on[1] {
		return nil, fmt.Errorf("%w: capture needs both its port 80 and its port 443 listener, or neither", ErrConfig)
	}
	var svcs []Service
	for _, c := range []struct {
		port uint16
		addr string
		ln   net.Listener
	}{{80, h.CaptureHTTP, h.CaptureHTTPListener}, {443, h.CaptureTLS, h.CaptureTLSListener}} {
		if c.addr == "" && c.ln == nil {
			continue
		}
		ln := c.ln
		if ln == nil {
			ap, err := netip.ParseAddrPort(c.addr)
			if err != nil {
				return nil, listenError{fmt.Errorf("capture address %q: want IP:PORT", c.addr)}
			}
			if ln, err = net.Listen("tcp", ap.String()); err != nil {
				return nil, listenError{fmt.Errorf("capture of port %d: %w", c.port, err)}
			}
		}
		b.onClose(func() { ln.Close() })
		s, err := proxy.NewCapture(ln, c.port)
		if err != nil {
			return nil, err
		}
		svcs = append(svcs, s)
	}
	return svcs, nil
}

// resolverComponent shows the shared resolver's cache in the API status.
type resolverComponent struct{ r *resolver.Resolver }

func (resolverComponent) Name() string { return "resolver" }
func (c resolverComponent) Stats() any { return c.r.Stats() }
