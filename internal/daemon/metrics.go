package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/audit"
	"github.com/abox-dev/abox/internal/metrics"
	"github.com/abox-dev/abox/internal/monitor"
)

// EnvStarts is the environment variable in which the supervisor tells each
// filter process how many it has started before it (0 for the first), so
// that abox_filter_restarts_total survives the restarts it counts.
const EnvStarts = "ABOX_FILTER_STARTS"

// ParseMetricsListen checks the address of the metrics listener
// (Config.MetricsListen): an IP:PORT on loopback. Metrics name no secrets
// but tell what the guest does, and the listener checks no credentials, so
// it is never offered to another host.
func ParseMetricsListen(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("metrics listener %q: want a loopback IP:PORT such as 127.0.0.1:9153", s)
	}
	if !ap.Addr().Unmap().IsLoopback() {
		return netip.AddrPort{}, fmt.Errorf("metrics listener %q: %s is not a loopback address; the listener has no authentication, so bind it to 127.0.0.1 or ::1 and let a scraper elsewhere come through an SSH tunnel", s, ap.Addr())
	}
	return ap, nil
}

// StartsFromEnv reads EnvStarts, Config.Restarts of a supervised filter
// process: 0 when unset, an error when it is not a count (a supervisor
// bug, reported rather than guessed around).
func StartsFromEnv() (int, error) {
	v := os.Getenv(EnvStarts)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s=%q: want a count of earlier starts", ErrConfig, EnvStarts, v)
	}
	return n, nil
}

// newRegistry builds the data plane's registry with the daemon's own
// metrics: the filter restarts, the count cfg carries.
func newRegistry(cfg Config) *metrics.Registry {
	reg := metrics.New(cfg.Instance)
	restarts := float64(cfg.Restarts)
	reg.CounterFunc(metrics.LayerDaemon, "abox_filter_restarts_total",
		"Times the supervisor restarted this instance's filter process.", func() float64 { return restarts })
	if cfg.MonitorStatus != "" {
		reg.Collector(metrics.LayerMonitor, newMonitorCollector(cfg.MonitorStatus))
	}
	return reg
}

// monitorCollector exposes the runtime monitor's counts, which the monitor
// (a process of its own, without an API) keeps in its status file: each
// event and drop is counted there once, and read here when scraped. A
// monitor that is not running exposes nothing; its restart resets the
// counters, as Prometheus expects of a process's counters.
type monitorCollector struct {
	path                     string
	events, dropped, connect *prometheus.Desc
}

func newMonitorCollector(path string) *monitorCollector {
	return &monitorCollector{
		path:    path,
		events:  prometheus.NewDesc("abox_monitor_events_total", "Runtime monitor events accepted from the guest since the monitor started.", nil, nil),
		dropped: prometheus.NewDesc("abox_monitor_dropped_total", "Runtime monitor lines dropped since the monitor started, by reason (oversize, rate, invalid).", []string{"reason"}, nil),
		connect: prometheus.NewDesc("abox_monitor_connected", "1 while the monitor's channel to the guest is open.", nil, nil),
	}
}

func (c *monitorCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.dropped
	ch <- c.connect
}

func (c *monitorCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := monitor.ReadStatus(c.path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			ch <- prometheus.NewInvalidMetric(c.events, err)
		}
		return
	}
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(st.Events))
	for _, d := range []struct {
		reason string
		n      uint64
	}{{"oversize", st.DroppedOversize}, {"rate", st.DroppedRate}, {"invalid", st.DroppedInvalid}} {
		ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(d.n), d.reason)
	}
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(c.connect, prometheus.GaugeValue, connected)
}

// listenMetrics binds the metrics listener of cfg, or returns nil for none.
func listenMetrics(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ap, err := ParseMetricsListen(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	ln, err := net.Listen("tcp", ap.String())
	if err != nil {
		return nil, listenError{fmt.Errorf("metrics listener: %w", err)}
	}
	return ln, nil
}

// serveMetrics serves GET /metrics alone on ln until ctx ends.
func serveMetrics(ctx context.Context, ln net.Listener, h http.Handler) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", h)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return api.ServeUntil(ctx, hs, ln, "metrics")
}

// filtersStarted is the audit record of a data plane's start.
type filtersStarted struct {
	Restarts  int    `json:"restarts"`
	Mode      string `json:"mode"`
	Allowlist string `json:"allowlist_sha256"`
}

// openAudit opens cfg's audit stream, if it has one.
func (b *builder) openAudit(cfg Config) error {
	if cfg.AuditDir == "" {
		return nil
	}
	if cfg.AuditKey == "" {
		return fmt.Errorf("%w: an audit stream needs its key file", ErrConfig)
	}
	key, err := audit.LoadKey(cfg.AuditKey)
	if err != nil {
		return err
	}
	s, err := audit.Open(audit.Config{Dir: cfg.AuditDir, Key: key})
	if err != nil {
		return err
	}
	b.audit = s
	b.onClose(func() { s.Close() })
	return nil
}
