package instance

import (
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"

	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/paths"
)

// DataPlane returns the daemon configuration of an instance: its DNS filter
// on GATEWAY:53, its proxy on GATEWAY:PROXY_PORT with its capture
// listeners (CaptureAddrs) and its local API, always starting active. socks are the sockets the supervisor bound, or nil to
// bind them here.
func DataPlane(l paths.Layout, st State, socks *daemon.Sockets, diag io.Writer) daemon.Config {
	f := l.Instance(st.Name)
	dnsAddr, httpAddr := FilterAddrs(st)
	capHTTP, capTLS := CaptureAddrs(st)
	cfg := daemon.Config{
		Instance:      st.Name,
		AllowlistPath: f.Allowlist,
		APISocket:     f.APISocket,
		Upstreams:     st.Upstreams,
		AllowPrivate:  st.AllowPrivate,
		AllowHost:     st.AllowHost,
		// The gateway is the host too, even before the bridge address is
		// visible on the host's interfaces.
		HostAddrs: []netip.Addr{st.Gateway},
		DNS:       &daemon.DNSConfig{Listen: dnsAddr},
		HTTP: &daemon.HTTPConfig{
			Listen:                   httpAddr,
			CaptureHTTP:              capHTTP,
			CaptureTLS:               capTLS,
			Ports:                    st.Ports,
			CADir:                    f.CADir,
			NoMITM:                   st.NoMITM,
			MITMExceptions:           st.MITMExceptions,
			UpstreamCA:               st.UpstreamCA,
			UpstreamProxy:            st.UpstreamProxy,
			UpstreamProxyCredentials: st.UpstreamProxyCredentials,
			KeyLogPath:               f.KeyLog,
			SecretsDir:               l.Secrets(),
		},
		Logs:          daemon.LogConfig{DNSFile: f.DNSLog, HTTPFile: f.HTTPLog, Diag: diag},
		MetricsListen: st.MetricsListen,
		AuditDir:      AuditDir(f),
		AuditKey:      AuditKey(l),
	}
	if st.Monitor {
		cfg.MonitorStatus = f.MonitorStatus
	}
	if socks != nil {
		cfg.DNS.PacketConn, cfg.DNS.Listener, cfg.HTTP.Listener = socks.DNSPacket, socks.DNSStream, socks.HTTP
		cfg.HTTP.CaptureHTTPListener, cfg.HTTP.CaptureTLSListener = socks.CaptureHTTP, socks.CaptureTLS
	}
	return cfg
}

// FilterAddrs returns the addresses of an instance's filters: the DNS filter's
// (UDP and TCP) and the proxy's.
func FilterAddrs(st State) (dnsAddr, httpAddr string) {
	gw := st.Gateway.String()
	return net.JoinHostPort(gw, "53"), net.JoinHostPort(gw, strconv.Itoa(int(st.ProxyPort)))
}

// CaptureAddrs returns the addresses of an instance's capture listeners,
// for the guest's connections to port 80 and to port 443 of other
// addresses.
func CaptureAddrs(st State) (httpAddr, tlsAddr string) {
	gw := st.Gateway.String()
	return net.JoinHostPort(gw, strconv.Itoa(CaptureHTTPPort)), net.JoinHostPort(gw, strconv.Itoa(CaptureTLSPort))
}

// RunFilters is the body of the per-instance filter process (`abox daemon
// run NAME`): the instance's data plane, on the sockets its supervisor
// handed over or on freshly bound ones, until ctx ends.
func RunFilters(ctx context.Context, l paths.Layout, name string, diag io.Writer, ready func()) error {
	st, err := Load(l, name)
	if err != nil {
		return err
	}
	socks, err := daemon.InheritedSockets()
	if err != nil {
		return err
	}
	restarts, err := daemon.StartsFromEnv()
	if err != nil {
		return err
	}
	boundFilters()
	cfg := DataPlane(l, st, socks, diag)
	cfg.Restarts = restarts
	if ready != nil {
		cfg.Ready = func(daemon.Info) { ready() }
	}
	return daemon.Run(ctx, cfg)
}

// FiltersMemoryLimit is the soft memory limit of an instance's filter
// daemon (GOMEMLIMIT overrides it): past it the Go runtime collects
// garbage harder instead of growing, so that one guest's flood, already
// held to the daemon's connection, request and query caps, costs the host
// a bounded heap. FiltersMemoryMax is the hard bound past that: the
// process's data segment (RLIMIT_DATA: its heap, stacks and every private
// writable mapping) cannot grow beyond it, so a leak or a flood the soft
// limit cannot absorb ends the daemon (its supervisor restarts it; the
// guest's traffic fails closed meanwhile) instead of the host's memory.
// FiltersNice lowers the daemon's CPU priority, so that a guest keeping
// its filters busy yields to the host's own work.
const (
	FiltersMemoryLimit = 1 << 30
	FiltersMemoryMax   = 4 << 30
	FiltersNice        = 5
)

// boundFilters applies FiltersMemoryLimit, FiltersMemoryMax and
// FiltersNice to this process. Limits already lower are kept.
func boundFilters() {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(FiltersMemoryLimit)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_DATA, &lim); err == nil {
		lim.Cur, lim.Max = min(lim.Cur, FiltersMemoryMax), min(lim.Max, FiltersMemoryMax)
		syscall.Setrlimit(syscall.RLIMIT_DATA, &lim)
	}
	if cur, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0); err == nil && 20-cur < FiltersNice {
		// Getpriority returns 20-nice on Linux.
		syscall.Setpriority(syscall.PRIO_PROCESS, 0, FiltersNice)
	}
}

// AuditKey is the host's audit checkpoint key file: in the data dir,
// outside every instance directory, so that an instance's export or
// removal never carries or takes it.
func AuditKey(l paths.Layout) string { return auditKeyIn(l.Root) }

// AuditDir is the directory of an instance's audit stream: a directory of
// its own (0700) under the logs directory, which QEMU shares.
func AuditDir(f paths.Instance) string { return filepath.Join(f.LogsDir, "audit") }
