package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/abox-dev/abox/internal/daemon"
)

// dnsServeOptions holds the flags of `abox dns serve`.
type dnsServeOptions struct {
	serveFlags
	listen    string
	minTTL    time.Duration
	maxTTL    time.Duration
	cacheSize int
	rateLimit float64
	rateBurst int
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
	o.register(f, "CIDR of private or reserved addresses that answers may contain, repeatable")
	f.BoolVar(&o.passive, "passive", false, "start in passive mode: allow and record every name (never with untrusted workloads)")
	f.DurationVar(&o.minTTL, "min-ttl", daemon.DefaultMinTTL, "TTL floor of answers")
	f.DurationVar(&o.maxTTL, "max-ttl", daemon.DefaultMaxTTL, "TTL ceiling of answers")
	f.IntVar(&o.cacheSize, "cache-size", daemon.DefaultCacheSize, "cached answers at most (0 disables the cache)")
	f.Float64Var(&o.rateLimit, "rate-limit", daemon.DefaultRateLimit, "queries per second per client (0 disables the limit)")
	f.IntVar(&o.rateBurst, "rate-burst", daemon.DefaultRateBurst, "queries a client may send in a burst")
	return cmd
}

func runDNSServe(ctx context.Context, e *env, o *dnsServeOptions) error {
	if o.minTTL < time.Second || o.maxTTL < o.minTTL {
		return usageError{fmt.Errorf("--min-ttl %s and --max-ttl %s: want 1s <= min <= max", o.minTTL, o.maxTTL)}
	}
	if o.rateLimit < 0 || o.rateBurst < 1 {
		return usageError{errors.New("--rate-limit must be >= 0 and --rate-burst >= 1")}
	}
	if o.cacheSize < 0 {
		return usageError{errors.New("--cache-size must be >= 0")}
	}
	cfg, _, closeLogs, err := o.resolve(e)
	if err != nil {
		return err
	}
	defer closeLogs()
	// On the command line 0 means off; in the daemon's Config it means the default.
	rate, cache := o.rateLimit, o.cacheSize
	if rate == 0 {
		rate = -1
	}
	if cache == 0 {
		cache = -1
	}
	cfg.DNS = &daemon.DNSConfig{
		Listen: o.listen,
		MinTTL: o.minTTL, MaxTTL: o.maxTTL,
		CacheSize: cache, RateLimit: rate, RateBurst: o.rateBurst,
	}
	cfg.Ready = func(i daemon.Info) {
		fmt.Fprintf(e.stderr, "abox: dns filter for %s on %s (udp+tcp), upstream %v, mode %s; api %s\n",
			o.name, i.DNSAddr, i.Upstreams, i.Mode, cfg.APISocket)
	}
	return serveDataPlane(ctx, cfg)
}
