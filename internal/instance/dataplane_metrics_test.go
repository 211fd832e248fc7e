package instance

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// The instance's metrics listener reaches the daemon; none by default.
func TestDataPlaneMetricsListen(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	st := State{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128}
	if cfg := DataPlane(l, st, nil, nil); cfg.MetricsListen != "" {
		t.Errorf("DataPlane without a setting: metrics listener %q, want none", cfg.MetricsListen)
	}
	st.MetricsListen = "127.0.0.1:9153"
	if cfg := DataPlane(l, st, nil, nil); cfg.MetricsListen != st.MetricsListen {
		t.Errorf("DataPlane: metrics listener %q, want %q", cfg.MetricsListen, st.MetricsListen)
	}
}

// An instance with the runtime monitor has its counts among the metrics.
func TestDataPlaneMonitorMetrics(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	st := State{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128}
	if cfg := DataPlane(l, st, nil, nil); cfg.MonitorStatus != "" {
		t.Errorf("no monitor: status %q, want none", cfg.MonitorStatus)
	}
	st.Monitor = true
	if cfg := DataPlane(l, st, nil, nil); cfg.MonitorStatus != l.Instance("dev").MonitorStatus {
		t.Errorf("monitor: status %q, want %q", cfg.MonitorStatus, l.Instance("dev").MonitorStatus)
	}
}

// Every instance's daemon feeds its audit stream, keyed by the host's key
// outside the instance directory.
func TestDataPlaneAudit(t *testing.T) {
	l := paths.Layout{Root: t.TempDir()}
	st := State{Name: "dev", Gateway: netip.MustParseAddr("10.10.7.1"), ProxyPort: 3128}
	cfg := DataPlane(l, st, nil, nil)
	if cfg.AuditDir == "" || !strings.HasPrefix(cfg.AuditDir, l.Instance("dev").LogsDir+"/") {
		t.Errorf("audit dir %q, want one under %s", cfg.AuditDir, l.Instance("dev").LogsDir)
	}
	if cfg.AuditKey == "" || strings.HasPrefix(cfg.AuditKey, l.Instances()) {
		t.Errorf("audit key %q, want one outside the instances", cfg.AuditKey)
	}
}
