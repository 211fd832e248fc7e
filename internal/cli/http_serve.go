package cli

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/daemon"
)

// httpServeOptions holds the flags of `abox http serve`.
type httpServeOptions struct {
	serveFlags
	listen      string
	upstreamCA  string
	caDir       string
	noMITM      bool
	exceptions  []string
	ports       string
	maxConns    int
	idleTimeout time.Duration
	rateLimit   float64
	rateBurst   int
	maxUpstream int
}

func newHTTPServeCmd(e *env) *cobra.Command {
	o := &httpServeOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the HTTP/HTTPS filtering proxy in the foreground",
		Long: `Run the filtering proxy in the foreground, with the local API of instance
--name, until interrupted. It accepts absolute-form HTTP requests and CONNECT.
Every request is checked against the allowlist and the port list, its host is
resolved once through --upstream and every address is classified: private,
loopback, link-local, reserved and the host's own addresses are refused unless
--allow-private names them. The proxy then connects to exactly the address it
checked.

HTTPS is intercepted with the instance CA (created on first use in --ca-dir;
the guest must trust ca.crt): the TLS server name and every inner request's
Host must match the CONNECT host, and a host whose allowlist entry has request
rules (NAME [METHOD,...] [PATTERN]) has every request decided by them.
--mitm-exception HOST and --no-mitm tunnel bytes instead, after checking the
ClientHello's server name; an entry with rules on such a host is refused at
start and on reload, since its requests could not be read.

One JSON line per request or tunnel goes to stderr (or --log-file) and to
` + "`abox http logs NAME`" + `; the TLS key log is switched with the local API.`,
		Example: `  abox http serve --listen 127.0.0.1:3128 --allowlist allow.txt --upstream 1.1.1.1
  abox http serve --listen 10.10.10.1:3128 --allowlist allow.txt --upstream 9.9.9.9 --ports 80,443,8443 --mitm-exception pinned.example.com`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runHTTPServe(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "standalone-http", "instance name: selects the API socket (for `abox http status NAME`), the default allowlist, CA and key log")
	f.StringVar(&o.listen, "listen", "127.0.0.1:3128", "IP:PORT to serve on")
	o.register(f, "CIDR of private or reserved addresses the proxy may connect to, repeatable")
	f.StringVar(&o.upstreamCA, "upstream-ca", "", "PEM FILE of extra roots trusted for upstream servers, besides the system roots")
	f.StringVar(&o.caDir, "ca-dir", "", "directory of the interception CA (default: the instance's ca/)")
	f.BoolVar(&o.noMITM, "no-mitm", false, "never intercept TLS: tunnel every CONNECT after checking its server name")
	f.StringArrayVar(&o.exceptions, "mitm-exception", nil, "HOST to tunnel instead of intercepting, repeatable")
	f.StringVar(&o.ports, "ports", "80,443", "comma-separated destination ports the guest may reach")
	f.BoolVar(&o.passive, "passive", false, "start in passive mode: allow and record every name (never with untrusted workloads; addresses are still checked)")
	f.IntVar(&o.maxConns, "max-conns", daemon.DefaultMaxConns, "concurrent guest connections at most")
	f.Float64Var(&o.rateLimit, "rate-limit", daemon.DefaultRequestRate, "requests per second per client, plain, CONNECT and intercepted alike (0 disables the limit)")
	f.IntVar(&o.rateBurst, "rate-burst", daemon.DefaultRequestBurst, "requests a client may send in a burst")
	f.IntVar(&o.maxUpstream, "max-upstream", daemon.DefaultMaxUpstream, "requests forwarded upstream at once, all clients together")
	f.DurationVar(&o.idleTimeout, "idle-timeout", daemon.DefaultIdleTimeout, "close a connection on which nothing moved for this long (there is no overall deadline)")
	return cmd
}

func parsePorts(s string) ([]uint16, error) {
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("--ports %q: %q is not a port (write for example 80,443)", s, f)
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

func runHTTPServe(ctx context.Context, e *env, o *httpServeOptions) error {
	ports, err := parsePorts(o.ports)
	if err != nil {
		return usageError{err}
	}
	if _, err := netip.ParseAddrPort(o.listen); err != nil {
		return usageError{fmt.Errorf("--listen %q: want IP:PORT (for example 10.10.10.1:3128)", o.listen)}
	}
	if o.maxConns < 1 || o.maxUpstream < 1 {
		return usageError{errors.New("--max-conns and --max-upstream must be >= 1")}
	}
	if o.rateLimit < 0 || o.rateBurst < 1 {
		return usageError{errors.New("--rate-limit must be >= 0 and --rate-burst >= 1")}
	}
	rate := o.rateLimit
	if rate == 0 { // off on the command line; the Config's 0 is the default
		rate = -1
	}
	cfg, l, closeLogs, err := o.resolve(e)
	if err != nil {
		return err
	}
	defer closeLogs()
	caDir := o.caDir
	if caDir == "" {
		caDir = l.CADir(o.name)
	}
	cfg.HTTP = &daemon.HTTPConfig{
		Listen:         o.listen,
		Ports:          ports,
		CADir:          caDir,
		NoMITM:         o.noMITM,
		MITMExceptions: o.exceptions,
		UpstreamCA:     o.upstreamCA,
		KeyLogPath:     l.KeyLog(o.name),
		MaxConns:       o.maxConns,
		IdleTimeout:    o.idleTimeout,
		RateLimit:      rate,
		RateBurst:      o.rateBurst,
		MaxUpstream:    o.maxUpstream,
	}
	cfg.Ready = func(i daemon.Info) {
		mitm := "intercepting TLS (CA " + i.CACert + ")"
		if o.noMITM {
			mitm = "tunnelling TLS (--no-mitm)"
		}
		fmt.Fprintf(e.stderr, "abox: http filter for %s on %s, ports %s, upstream %v, mode %s, %s; api %s\n",
			o.name, i.HTTPAddr, o.ports, i.Upstreams, i.Mode, mitm, cfg.APISocket)
	}
	return serveDataPlane(ctx, cfg)
}
