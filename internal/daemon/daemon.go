// Package daemon is the one place the data plane is built: from one Config it
// makes the decision logs, the policy engine (file watch, SIGHUP reload), the
// resolver, the DNS filter and the proxy with its CA, and the local API; it
// runs them under one errgroup with explicit readiness and takes them down in
// reverse order. `abox dns serve`, `abox http serve` and the per-instance
// daemon are all Run with different Configs.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/metrics"
	"github.com/abox-dev/abox/internal/policy"
)

// Service is a filter the daemon hosts. Its listeners are bound before Run is
// called, so a bound listener is what readiness means.
type Service interface {
	api.Component
	// Serve runs until ctx ends and then returns nil after a bounded shutdown.
	Serve(ctx context.Context) error
}

// Options is a built data plane, ready to serve.
type Options struct {
	Instance string
	Policy   *policy.Engine
	Services []Service
	// Extra are components shown in the API status that serve nothing
	// themselves (the shared resolver).
	Extra []api.Component
	// Logs are the services' decision-log rings, keyed by service name.
	Logs map[string]*logring.Ring
	// KeyLog is the HTTP filter's key-log switch, if any.
	KeyLog api.KeyLogger
	// APISocket is the unix socket path of the local API.
	APISocket string
	Logger    *slog.Logger
	// Metrics are the data plane's metrics, served on the API socket and,
	// when MetricsListener is set, on it.
	Metrics         *metrics.Registry
	MetricsListener net.Listener
	// Ready is called once every listener is bound and the API answers.
	Ready func()
}

// serve runs o until ctx ends or a service fails; any failure stops
// everything, so a broken filter never leaves the others running
// half-configured.
func serve(ctx context.Context, o Options) error {
	if o.Policy == nil {
		return errors.New("running filters: no policy")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := api.Listen(o.APISocket)
	if err != nil {
		return err
	}
	defer os.Remove(o.APISocket)

	comps := make([]api.Component, 0, len(o.Services)+len(o.Extra))
	for _, s := range o.Services {
		comps = append(comps, s)
	}
	comps = append(comps, o.Extra...)
	srv := &api.Server{Instance: o.Instance, Policy: o.Policy, Components: comps, Logs: o.Logs, KeyLog: o.KeyLog, Logger: log}
	if o.Metrics != nil {
		srv.Metrics = o.Metrics.Handler()
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(gctx, ln) })
	g.Go(func() error { return o.Policy.Watch(gctx) })
	if o.MetricsListener != nil && srv.Metrics != nil {
		g.Go(func() error { return serveMetrics(gctx, o.MetricsListener, srv.Metrics) })
	}
	// SIGHUP is caught before Ready: a hangup sent once the daemon says it
	// is ready reloads, and never meets the default action (exit).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	g.Go(func() error { return reloadOnHangup(gctx, hup, o.Policy, log) })
	for _, s := range o.Services {
		g.Go(func() error {
			if err := s.Serve(gctx); err != nil {
				return fmt.Errorf("%s filter: %w", s.Name(), err)
			}
			return nil
		})
	}
	log.Info("filters ready", "instance", o.Instance, "api", o.APISocket, "mode", string(o.Policy.Mode()))
	if o.Ready != nil {
		o.Ready()
	}
	return g.Wait()
}

func reloadOnHangup(ctx context.Context, ch <-chan os.Signal, p *policy.Engine, log *slog.Logger) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
			if err := p.Reload(); err != nil {
				log.Error("SIGHUP reload rejected", "error", err.Error())
			}
		}
	}
}
