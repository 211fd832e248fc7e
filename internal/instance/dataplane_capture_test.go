package instance

import (
	"net"
	"net/netip"
	"strconv"
	"testing"

	"github.com/abox-dev/abox/internal/paths"
)

// TestCaptureOnEveryLayer: an instance's proxy listens on the capture
// ports of its gateway, and its host firewall and packet filter are built
// with the same ports, so that what the host DNATs arrives where the
// proxy listens and is admitted on the way.
func TestCaptureOnEveryLayer(t *testing.T) {
	st := State{Name: "dev", Bridge: "abx-dev", Gateway: netip.MustParseAddr("10.10.7.1"), GuestIP: netip.MustParseAddr("10.10.7.10"), ProxyPort: DefaultProxyPort}
	cfg := DataPlane(paths.Layout{Root: t.TempDir()}, st, nil, nil)
	gw := st.Gateway.String()
	if cfg.HTTP.CaptureHTTP != net.JoinHostPort(gw, strconv.Itoa(CaptureHTTPPort)) || cfg.HTTP.CaptureTLS != net.JoinHostPort(gw, strconv.Itoa(CaptureTLSPort)) {
		t.Errorf("capture listeners %q and %q, want the gateway's ports %d and %d", cfg.HTTP.CaptureHTTP, cfg.HTTP.CaptureTLS, CaptureHTTPPort, CaptureTLSPort)
	}
	if b := FirewallBridge(st); b.CaptureHTTPPort != CaptureHTTPPort || b.CaptureTLSPort != CaptureTLSPort {
		t.Errorf("host firewall capture ports %d and %d, want %d and %d", b.CaptureHTTPPort, b.CaptureTLSPort, CaptureHTTPPort, CaptureTLSPort)
	}
	if p := ParamsOf(paths.Layout{Root: t.TempDir()}, st); p.CaptureHTTPPort != CaptureHTTPPort || p.CaptureTLSPort != CaptureTLSPort {
		t.Errorf("nwfilter capture ports %d and %d, want %d and %d", p.CaptureHTTPPort, p.CaptureTLSPort, CaptureHTTPPort, CaptureTLSPort)
	}
}
