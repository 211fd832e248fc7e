package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/upstream"
	"github.com/abox-dev/abox/internal/validate"
)

// dnsServeOptions holds the flags of `abox dns serve`.
type dnsServeOptions struct {
	name         string
	listen       string
	allowlist    string
	upstreams    []string
	allowPrivate []string
	allowHost    []string
	passive      bool
	logFile      string
	minTTL       time.Duration
	maxTTL       time.Duration
	cacheSize    int
	rateLimit    float64
	rateBurst    int
	timeout      time.Duration
}

func newDNSServeCmd(e *env) *cobra.Command {
	o := &dnsServeOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the DNS filter in the foreground",
		Long: `Run the DNS filter in the foreground on UDP and TCP, with the local API of
instance --name, until interrupted. Allowlisted names are resolved through the
upstream resolvers and every answer address is checked; everything else gets
NXDOMAIN with an Extended DNS Error giving the reason. One JSON line per
decision goes to stderr (or --log-file) and to ` + "`abox dns logs NAME`" + `.

The allowlist file is watched: edits (including an editor's rename) apply
within a second; a file with an invalid line is rejected whole and the
previous list stays in force.`,
		Example: `  abox dns serve --listen 127.0.0.1:5353 --allowlist allow.txt --upstream 1.1.1.1
  abox dns serve --listen 10.10.10.1:53 --allowlist allow.txt --upstream 9.9.9.9 --upstream 1.1.1.1:53 --allow-private 10.20.0.0/16`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runDNSServe(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.name, "name", "standalone", "instance name: selects the API socket (for `abox dns status NAME`) and the default allowlist")
	f.StringVar(&o.listen, "listen", "127.0.0.1:5353", "IP:PORT to serve on, UDP and TCP")
	f.StringVar(&o.allowlist, "allowlist", "", "allowlist FILE (default: the instance's allowlist.txt)")
	f.StringArrayVar(&o.upstreams, "upstream", nil, "upstream resolver IP[:PORT], repeatable, tried in order (default: the host's, from /etc/resolv.conf)")
	f.StringArrayVar(&o.allowPrivate, "allow-private", nil, "CIDR of private or reserved addresses that answers may contain, repeatable")
	f.StringArrayVar(&o.allowHost, "allow-host", nil, allowHostUsage)
	f.BoolVar(&o.passive, "passive", false, "start in passive mode: allow and record every name (never with untrusted workloads)")
	f.StringVar(&o.logFile, "log-file", "", "append decision lines to FILE instead of stderr")
	f.DurationVar(&o.minTTL, "min-ttl", dnsfilter.DefaultMinTTL, "TTL floor of answers")
	f.DurationVar(&o.maxTTL, "max-ttl", dnsfilter.DefaultMaxTTL, "TTL ceiling of answers")
	f.IntVar(&o.cacheSize, "cache-size", dnsfilter.DefaultCacheSize, "cached answers at most (0 disables the cache)")
	f.Float64Var(&o.rateLimit, "rate-limit", dnsfilter.DefaultRateLimit, "queries per second per client (0 disables the limit)")
	f.IntVar(&o.rateBurst, "rate-burst", dnsfilter.DefaultRateBurst, "queries a client may send in a burst")
	f.DurationVar(&o.timeout, "upstream-timeout", upstream.DefaultTimeout, "timeout of one try against one upstream")
	return cmd
}

// dnsServeConfig is what the flags resolve to before anything is started.
type dnsServeConfig struct {
	allowlist string
	permit    []netip.Prefix
	// permitHost are the --allow-host ranges.
	permitHost []netip.Prefix
	upstream   *upstream.Client
}

func (o *dnsServeOptions) resolve(e *env) (dnsServeConfig, error) {
	var c dnsServeConfig
	if err := validate.InstanceName(o.name); err != nil {
		return c, usageError{fmt.Errorf("--name: %w", err)}
	}
	if o.minTTL < time.Second || o.maxTTL < o.minTTL {
		return c, usageError{fmt.Errorf("--min-ttl %s and --max-ttl %s: want 1s <= min <= max", o.minTTL, o.maxTTL)}
	}
	if o.rateLimit < 0 || o.rateBurst < 1 {
		return c, usageError{errors.New("--rate-limit must be >= 0 and --rate-burst >= 1")}
	}
	c.allowlist = o.allowlist
	if c.allowlist == "" {
		l, err := e.layout()
		if err != nil {
			return c, err
		}
		c.allowlist = l.Allowlist(o.name)
	}
	abs, err := filepath.Abs(c.allowlist)
	if err != nil {
		return c, fmt.Errorf("allowlist: %w", err)
	}
	c.allowlist = abs
	if _, err := os.Stat(c.allowlist); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return c, withHint(fmt.Errorf("allowlist %s does not exist", c.allowlist),
				"create it with one name per line (for example `echo example.com > allow.txt`) and pass --allowlist allow.txt")
		}
		return c, fmt.Errorf("allowlist: %w", err)
	}
	if c.permit, err = parsePermit("--allow-private", o.allowPrivate, e.stderr); err != nil {
		return c, usageError{err}
	}
	if c.permitHost, err = parsePermit("--allow-host", o.allowHost, e.stderr); err != nil {
		return c, usageError{err}
	}
	for _, u := range o.upstreams {
		if _, err := upstream.ParseServer(u); err != nil {
			return c, usageError{fmt.Errorf("--upstream: %w", err)}
		}
	}
	up, err := upstream.New(upstream.Config{Servers: o.upstreams, Timeout: o.timeout})
	if err != nil {
		return c, err
	}
	c.upstream = up
	return c, nil
}

func runDNSServe(ctx context.Context, e *env, o *dnsServeOptions) error {
	c, err := o.resolve(e)
	if err != nil {
		return err
	}
	l, err := e.layout()
	if err != nil {
		return err
	}
	logs, err := openServeLogs(e, o.logFile)
	if err != nil {
		return err
	}
	defer logs.Close()
	ring, dlog, log := logs.ring, logs.decisions, logs.diag

	pol, err := policy.New(policy.Config{AllowlistPath: c.allowlist, Logger: log})
	if err != nil {
		return withHint(err, "fix the listed lines (check a file with `abox allowlist check FILE`)")
	}
	if o.passive {
		pol.SetMode(policy.Passive)
	}
	host, err := netclass.HostAddrs()
	if err != nil {
		return err
	}
	pc, ln, err := dnsfilter.Listen(o.listen)
	if err != nil {
		return usageError{err}
	}
	rate := o.rateLimit
	if rate == 0 {
		rate = -1
	}
	cache := o.cacheSize
	if cache == 0 {
		cache = -1
	}
	srv, err := dnsfilter.New(dnsfilter.Config{
		PacketConn: pc, Listener: ln,
		Policy: pol, Upstream: c.upstream,
		Addrs:  netclass.New(netclass.Options{Permit: c.permit, PermitHost: c.permitHost, Host: host}),
		Logger: log, DecisionLog: dlog,
		MinTTL: o.minTTL, MaxTTL: o.maxTTL,
		CacheSize: cache, RateLimit: rate, RateBurst: o.rateBurst,
	})
	if err != nil {
		pc.Close()
		ln.Close()
		return err
	}
	sock := l.APISocket(o.name)
	return daemon.Run(ctx, daemon.Options{
		Instance:  o.name,
		Policy:    pol,
		Services:  []daemon.Service{srv},
		Logs:      map[string]*logring.Ring{"dns": ring},
		APISocket: sock,
		Logger:    log,
		Ready: func() {
			fmt.Fprintf(e.stderr, "abox: dns filter for %s on %s (udp+tcp), upstream %v, mode %s; api %s\n",
				o.name, srv.Addr(), c.upstream.Servers(), pol.Mode(), sock)
		},
	})
}
