package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/validate"
)

// parsePermit parses the values of one address-range flag (--allow-private,
// --allow-host): CIDRs, or single addresses. Warnings (a range wider than a
// site) go to warn.
func parsePermit(flag string, list []string, warn io.Writer) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		p, w, err := netclass.ParsePermit(flag, s)
		if err != nil {
			return nil, err
		}
		if w != "" {
			fmt.Fprintf(warn, "warning: %s\n", w)
		}
		out = append(out, p)
	}
	return out, nil
}

// allowHostUsage is the help of --allow-host, the same for every command.
const allowHostUsage = "CIDR the guest may reach even though it holds host addresses, loopback or other instances' networks, repeatable (--allow-private never opens those)"

// serveFlags are the flags both serve commands take.
type serveFlags struct {
	cpuProfile   string
	name         string
	allowlist    string
	upstreams    []string
	allowPrivate []string
	allowHost    []string
	passive      bool
	logFile      string
	timeout      time.Duration
	metrics      string
}

// register adds the shared flags to fs; name, passive and the filter's
// own flags are the command's.
func (f *serveFlags) register(fs *pflag.FlagSet, allowPrivateUsage string) {
	fs.StringVar(&f.cpuProfile, "cpu-profile", "", "write a pprof CPU profile of the run to FILE")
	fs.MarkHidden("cpu-profile")
	fs.StringVar(&f.allowlist, "allowlist", "", "allowlist FILE (default: the instance's allowlist.txt)")
	fs.StringArrayVar(&f.upstreams, "upstream", nil, "upstream resolver IP[:PORT], repeatable, tried in order (default: the host's, from /etc/resolv.conf)")
	fs.StringArrayVar(&f.allowPrivate, "allow-private", nil, allowPrivateUsage)
	fs.StringArrayVar(&f.allowHost, "allow-host", nil, allowHostUsage)
	fs.StringVar(&f.logFile, "log-file", "", "append decision lines to FILE instead of stderr")
	fs.StringVar(&f.metrics, "metrics-listen", "", "loopback IP:PORT on which to serve Prometheus metrics to a scraper as well as on the API socket (off by default)")
	fs.DurationVar(&f.timeout, "upstream-timeout", daemon.DefaultUpstreamTimeout, "timeout of the tries against one upstream resolver")
}

// resolve checks the shared flags and returns the data plane's Config
// without its filters, the layout, and the closer of the log file.
func (f *serveFlags) resolve(e *env) (daemon.Config, paths.Layout, func(), error) {
	var cfg daemon.Config
	fail := func(err error) (daemon.Config, paths.Layout, func(), error) { return cfg, paths.Layout{}, nil, err }
	if err := validate.InstanceName(f.name); err != nil {
		return fail(usageError{fmt.Errorf("--name: %w", err)})
	}
	permit, err := parsePermit("--allow-private", f.allowPrivate, e.stderr)
	if err != nil {
		return fail(usageError{err})
	}
	permitHost, err := parsePermit("--allow-host", f.allowHost, e.stderr)
	if err != nil {
		return fail(usageError{err})
	}
	if f.metrics != "" {
		if _, err := daemon.ParseMetricsListen(f.metrics); err != nil {
			return fail(usageError{fmt.Errorf("--metrics-listen: %w", err)})
		}
	}
	for _, u := range f.upstreams {
		if _, err := daemon.ParseUpstream(u); err != nil {
			return fail(usageError{fmt.Errorf("--upstream: %w", err)})
		}
	}
	l, err := e.layout()
	if err != nil {
		return fail(err)
	}
	allowlist := f.allowlist
	if allowlist == "" {
		allowlist = l.Allowlist(f.name)
	}
	if allowlist, err = filepath.Abs(allowlist); err != nil {
		return fail(fmt.Errorf("allowlist: %w", err))
	}
	if _, err := os.Stat(allowlist); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fail(withHint(fmt.Errorf("allowlist %s does not exist", allowlist),
				"create it with one name per line (for example `echo example.com > allow.txt`) and pass --allowlist allow.txt"))
		}
		return fail(fmt.Errorf("allowlist: %w", err))
	}
	logs, closeLogs, err := serveLogStream(e, f.logFile)
	if err != nil {
		return fail(err)
	}
	return daemon.Config{
		Instance:        f.name,
		AllowlistPath:   allowlist,
		Passive:         f.passive,
		APISocket:       l.APISocket(f.name),
		Upstreams:       f.upstreams,
		UpstreamTimeout: f.timeout,
		AllowPrivate:    permit,
		AllowHost:       permitHost,
		Logs:            logs,
		CPUProfile:      f.cpuProfile,
		MetricsListen:   f.metrics,
	}, l, closeLogs, nil
}

// serveLogStream is the logging of a foreground filter: decision lines and
// diagnostics in one stream, to the log file or stderr. A log file is
// size-capped and rotated as an instance's are, and its refusal stream
// goes next to it (see daemon.LogConfig.StreamFile).
func serveLogStream(e *env, logFile string) (daemon.LogConfig, func(), error) {
	if logFile == "" {
		return daemon.LogConfig{Stream: e.stderr}, func() {}, nil
	}
	return daemon.LogConfig{StreamFile: logFile}, func() {}, nil
}

// serveDataPlane runs cfg, turning its errors into usage errors and hints.
func serveDataPlane(ctx context.Context, cfg daemon.Config) error {
	err := daemon.Run(ctx, cfg)
	switch {
	case errors.Is(err, daemon.ErrAllowlist):
		return withHint(err, "fix the listed lines (check a file with `abox allowlist check FILE`)")
	case errors.Is(err, daemon.ErrConfig), errors.Is(err, daemon.ErrListen):
		return usageError{err}
	}
	return err
}
