package daemon

import (
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/upstream"
)

// Defaults of the data plane, for commands that show them in their flags.
const (
	DefaultMinTTL          = dnsfilter.DefaultMinTTL
	DefaultMaxTTL          = dnsfilter.DefaultMaxTTL
	DefaultCacheSize       = dnsfilter.DefaultCacheSize
	DefaultRateLimit       = dnsfilter.DefaultRateLimit
	DefaultRateBurst       = dnsfilter.DefaultRateBurst
	DefaultUpstreamTimeout = upstream.DefaultTimeout
	DefaultMaxConns        = 1024
	DefaultRequestRate     = httpfilter.DefaultRequestRate
	DefaultRequestBurst    = httpfilter.DefaultRequestBurst
	DefaultMaxUpstream     = httpfilter.DefaultMaxUpstream
	DefaultIdleTimeout     = 10 * time.Minute
)

// Config is everything one data plane is built from: `abox dns serve`,
// `abox http serve` and the per-instance daemon differ only in it.
type Config struct {
	// Instance names the API's instance and the CA's subject; required.
	Instance string
	// AllowlistPath is the allowlist file, watched and reloaded; required.
	AllowlistPath string
	// Passive starts in passive mode. The zero value is active, so a daemon
	// that forgets to set it fails closed.
	Passive bool
	// APISocket is the unix socket of the local API; required.
	APISocket string

	// Upstreams are resolver addresses (IP or IP:PORT) in failover order;
	// empty means the host's (/etc/resolv.conf).
	Upstreams []string
	// UpstreamTimeout bounds the tries against one resolver; 0 means
	// DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// AllowPrivate are the private or reserved ranges that answers may
	// contain and the proxy may connect to.
	AllowPrivate []netip.Prefix
	// AllowHost are ranges the guest may reach although they hold host
	// addresses, loopback or other instances' networks (AllowPrivate never
	// opens those).
	AllowHost []netip.Prefix
	// HostAddrs are addresses of this host besides those on its interfaces
	// now (a gateway whose bridge is not up yet); they are never
	// destinations, whatever AllowPrivate says.
	HostAddrs []netip.Addr

	// DNS is the DNS filter, nil for none.
	DNS *DNSConfig
	// HTTP is the proxy, nil for none. At least one of DNS and HTTP is set.
	HTTP *HTTPConfig

	Logs LogConfig

	// MetricsListen is a loopback IP:PORT on which GET /metrics is also
	// served over TCP for a scraper (ParseMetricsListen); empty: on the
	// API socket only. Any other address is refused.
	MetricsListen string
	// AuditDir, when set, is the directory of the instance's audit stream
	// (docs/audit.md): every decision line of both filters, each policy
	// change and this start go to it. AuditKey is the file of the host's
	// checkpoint key (audit.LoadKey creates it); required with AuditDir.
	AuditDir, AuditKey string
	// MonitorStatus is the runtime monitor's status file
	// (paths.Instance.MonitorStatus), whose counts a scrape reads; empty:
	// no monitor metrics.
	MonitorStatus string
	// Restarts is how many times this data plane's process was restarted
	// before this run (StartsFromEnv, in a supervised process).
	Restarts int

	// CPUProfile, when set, is a file that receives a pprof CPU profile of
	// the whole run (for `make bench` and speed work).
	CPUProfile string

	// Ready is called once every listener is bound and the API answers.
	Ready func(Info)
}

// DNSConfig configures the DNS filter.
type DNSConfig struct {
	// Listen is the IP:PORT served on UDP and TCP, used when PacketConn and
	// Listener are nil.
	Listen string
	// PacketConn and Listener are sockets bound by someone else (the
	// supervisor); Run owns them once called.
	PacketConn net.PacketConn
	Listener   net.Listener
	// MinTTL and MaxTTL bound cached and served TTLs; 0 means the defaults.
	MinTTL, MaxTTL time.Duration
	// CacheSize bounds cached answers: 0 means DefaultCacheSize, negative
	// disables the cache.
	CacheSize int
	// RateLimit is queries per second per client: 0 means
	// DefaultRateLimit, negative disables it; RateBurst 0 means the default.
	RateLimit float64
	RateBurst int
}

// HTTPConfig configures the proxy.
type HTTPConfig struct {
	// Listen is the IP:PORT served, used when Listener is nil. An address
	// other than the unspecified one is the gateway the guest sees and is
	// never a destination.
	Listen   string
	Listener net.Listener
	// CaptureHTTP and CaptureTLS, when set (IP:PORT), are where the host
	// redirects the guest's connections to ports 80 and 443 of any other
	// address: each is decided as a request to the proxy for the name its
	// Host header or TLS SNI carries (httpfilter.Capture). The listeners,
	// when set, are sockets bound by someone else and win over the
	// addresses. Both or neither.
	CaptureHTTP, CaptureTLS                 string
	CaptureHTTPListener, CaptureTLSListener net.Listener
	// Ports are the destination ports allowed; empty means 80 and 443.
	Ports []uint16
	// CADir holds the interception CA, created on first run; required.
	CADir string
	// NoMITM tunnels every CONNECT instead of intercepting it;
	// MITMExceptions tunnels these hosts only.
	NoMITM         bool
	MITMExceptions []string
	// UpstreamCA is a PEM file of roots trusted for origins besides the
	// system roots, or empty.
	UpstreamCA string
	// UpstreamProxy is a parent proxy (http://HOST:PORT) the checked
	// addresses are dialled through, or empty for direct connections;
	// UpstreamProxyCredentials is a file with its USER:PASSWORD.
	UpstreamProxy            string
	UpstreamProxyCredentials string
	// KeyLogPath is where the TLS key log goes when switched on.
	KeyLogPath string
	// SecretsDir is the host's secret store (paths.Layout.Secrets): the
	// proxy injects the instance's bound secrets from it and refuses
	// their placeholders elsewhere (docs/secrets.md). Empty: no secrets.
	SecretsDir string
	// MaxConns bounds concurrent guest connections (0: DefaultMaxConns);
	// IdleTimeout closes a connection idle this long (0: DefaultIdleTimeout).
	MaxConns    int
	IdleTimeout time.Duration
	// RateLimit is requests per second per guest address: 0 means
	// DefaultRequestRate, negative disables it; RateBurst 0 means the
	// default. MaxUpstream bounds requests forwarded at once (0: default).
	RateLimit   float64
	RateBurst   int
	MaxUpstream int
}

// LogConfig says where decision lines and diagnostics go.
type LogConfig struct {
	// DNSFile and HTTPFile, when set, receive each filter's decision lines
	// (mode 0600, size-capped and rotated; paths.Instance names them);
	// diagnostics then go to Diag. Every line but allowed decisions also
	// goes to the file's refusal stream, decisionlog.RefusalsPath(file),
	// capped and rotated on its own.
	DNSFile, HTTPFile string
	// FileMaxMB is the size at which each file is rotated (0:
	// decisionlog.DefaultMaxFileMB).
	FileMaxMB int
	// Stream, when the files are not set, receives decision lines and
	// diagnostics alike, as JSON lines.
	Stream io.Writer
	// StreamFile, when set instead of Stream (`--log-file`), is a file
	// that receives them, size-capped and rotated, with its refusal
	// stream in decisionlog.RefusalsPath(StreamFile).
	StreamFile string
	// streamRefusals is StreamFile's refusal stream, once opened.
	streamRefusals io.Writer
	// Diag receives diagnostics when the files are set; nil discards them.
	Diag io.Writer
	// RingLines is how many recent lines per filter the API keeps for
	// `abox dns logs` / `abox http logs`, and as many of its refusal
	// stream (the component NAME+RefusalsSuffix, `logs --refusals`);
	// 0 means 2000.
	RingLines int
}

// RefusalsSuffix names a filter's refusal stream among the API's log
// components: "dns-refusals", "http-refusals".
const RefusalsSuffix = "-refusals"

// Info is what a started data plane tells its caller.
type Info struct {
	// DNSAddr and HTTPAddr are the bound addresses, nil for a filter that is off.
	DNSAddr, HTTPAddr net.Addr
	// Upstreams are the resolvers in use, in failover order.
	Upstreams []string
	// Mode is the policy mode at start ("active" or "passive").
	Mode string
	// MetricsAddr is the metrics listener's bound address, nil for none.
	MetricsAddr net.Addr
	// CACert is the interception CA's certificate file, when the proxy runs.
	CACert string
}

// ParseUpstream checks a resolver address as Config.Upstreams takes it and
// returns it as IP:PORT.
func ParseUpstream(s string) (string, error) { return upstream.ParseServer(s) }
