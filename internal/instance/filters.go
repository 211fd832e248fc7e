package instance

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/daemon"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/upstream"
)

// RunFilters runs an instance's DNS filter on GATEWAY:53, its proxy on
// GATEWAY:PROXY_PORT and its local API, until ctx ends. It is the body of
// the per-instance daemon. A restarted daemon always comes back active.
func RunFilters(ctx context.Context, l paths.Layout, name string, diag io.Writer, ready func()) error {
	st, err := Load(l, name)
	if err != nil {
		return err
	}
	f := FilesOf(l, name)
	dnsRing, httpRing := logring.New(2000), logring.New(2000)
	dnsLogFile, err := openAppend(f.LogsDir, "dns.log")
	if err != nil {
		return err
	}
	defer dnsLogFile.Close()
	httpLogFile, err := openAppend(f.LogsDir, "http.log")
	if err != nil {
		return err
	}
	defer httpLogFile.Close()
	log := slog.New(slog.NewJSONHandler(diag, nil))
	// Decision lines and the DNS filter's diagnostics, batched to the file
	// and the ring. Closed (deferred) before the file is.
	dnsDecisions := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{dnsLogFile, dnsRing}})
	defer dnsDecisions.Close()
	dnsLog := slog.New(slog.NewJSONHandler(dnsDecisions, nil))
	httpDecisions := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{httpLogFile, httpRing}})
	defer httpDecisions.Close()

	pol, err := policy.New(policy.Config{AllowlistPath: f.Allowlist, Logger: log})
	if err != nil {
		return err
	}
	host, err := netclass.HostAddrs()
	if err != nil {
		return err
	}
	// The gateway is the host too, even if the bridge address is not yet
	// visible to HostAddrs.
	host = append(host, st.Gateway)
	addrs := netclass.NewPolicy(st.AllowPrivate, host)
	up, err := upstream.New(upstream.Config{Servers: st.Upstreams})
	if err != nil {
		return err
	}
	gw := st.Gateway.String()
	pc, dl, err := dnsfilter.Listen(net.JoinHostPort(gw, "53"))
	if err != nil {
		return fmt.Errorf("dns filter on %s:53: %w", gw, err)
	}
	dns, err := dnsfilter.New(dnsfilter.Config{
		PacketConn: pc, Listener: dl, Policy: pol, Upstream: up, Addrs: addrs, Logger: dnsLog, DecisionLog: dnsDecisions,
	})
	if err != nil {
		pc.Close()
		dl.Close()
		return err
	}
	hl, err := net.Listen("tcp", net.JoinHostPort(gw, strconv.Itoa(int(st.ProxyPort))))
	if err != nil {
		pc.Close()
		dl.Close()
		return fmt.Errorf("proxy on %s:%d: %w", gw, st.ProxyPort, err)
	}
	authority, err := ca.New(ca.Config{Dir: f.CADir, Name: name})
	if err != nil {
		hl.Close()
		pc.Close()
		dl.Close()
		return err
	}
	roots, err := ca.UpstreamRoots(st.UpstreamCA)
	if err != nil {
		hl.Close()
		pc.Close()
		dl.Close()
		return err
	}
	// With a parent proxy the guard's checked addresses are dialled
	// through it; without one, directly.
	var dialer egress.Dialer
	if st.UpstreamProxy != "" {
		pp, err := egress.NewParentProxy(st.UpstreamProxy, st.UpstreamProxyCredentials)
		if err != nil {
			hl.Close()
			pc.Close()
			dl.Close()
			return err
		}
		dialer = pp
	}
	proxy, err := httpfilter.New(httpfilter.Config{
		UpstreamRoots: roots, Dialer: dialer,
		Listener: hl, Policy: pol, Resolver: up, Addresses: addrs, Ports: st.Ports,
		CA: authority, NoMITM: st.NoMITM, MITMExceptions: st.MITMExceptions,
		KeyLogPath: f.KeyLog, Decisions: httpDecisions, Logger: log,
	})
	if err != nil {
		hl.Close()
		pc.Close()
		dl.Close()
		return err
	}
	return daemon.Run(ctx, daemon.Options{
		Instance:  name,
		Policy:    pol,
		Services:  []daemon.Service{dns, proxy},
		Logs:      map[string]*logring.Ring{"dns": dnsRing, "http": httpRing},
		KeyLog:    proxy,
		APISocket: f.APISocket,
		Logger:    log,
		Ready:     ready,
	})
}

func openAppend(dir, name string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return os.OpenFile(dir+"/"+name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
}
