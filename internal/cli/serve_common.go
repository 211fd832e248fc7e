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

	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/paths"
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

// serveConfig is what the flags shared by both serve commands resolve to.
type serveConfig struct {
	layout    paths.Layout
	allowlist string // absolute, exists
	permit    []netip.Prefix
	// permitHost are the --allow-host ranges.
	permitHost []netip.Prefix
}

func resolveServe(e *env, name, allowlist string, upstreams, allowPrivate, allowHost []string) (serveConfig, error) {
	var c serveConfig
	var err error
	if c.permit, err = parsePermit("--allow-private", allowPrivate, e.stderr); err != nil {
		return c, usageError{err}
	}
	if c.permitHost, err = parsePermit("--allow-host", allowHost, e.stderr); err != nil {
		return c, usageError{err}
	}
	for _, u := range upstreams {
		if _, err := daemon.ParseUpstream(u); err != nil {
			return c, usageError{fmt.Errorf("--upstream: %w", err)}
		}
	}
	if c.layout, err = e.layout(); err != nil {
		return c, err
	}
	if allowlist == "" {
		allowlist = c.layout.Allowlist(name)
	}
	if c.allowlist, err = filepath.Abs(allowlist); err != nil {
		return c, fmt.Errorf("allowlist: %w", err)
	}
	if _, err := os.Stat(c.allowlist); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return c, withHint(fmt.Errorf("allowlist %s does not exist", c.allowlist),
				"create it with one name per line (for example `echo example.com > allow.txt`) and pass --allowlist allow.txt")
		}
		return c, fmt.Errorf("allowlist: %w", err)
	}
	return c, nil
}

// serveLogStream is the logging of a foreground filter: decision lines and
// diagnostics in one stream, to the log file or stderr.
func serveLogStream(e *env, logFile string) (daemon.LogConfig, func(), error) {
	if logFile == "" {
		return daemon.LogConfig{Stream: e.stderr}, func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
		return daemon.LogConfig{}, nil, fmt.Errorf("opening --log-file: %w", err)
	}
	f, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return daemon.LogConfig{}, nil, fmt.Errorf("opening --log-file: %w", err)
	}
	return daemon.LogConfig{Stream: f}, func() { f.Close() }, nil
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
