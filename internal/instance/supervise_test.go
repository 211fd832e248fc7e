package instance

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/testutil/need"
)

// TestMain lets the test binary stand in for the abox binary: ProcessDaemon
// runs `EXE daemon supervise NAME` and the supervisor `EXE daemon run NAME`,
// so the supervisor test runs the real supervisor and the real data plane
// as processes.
func TestMain(m *testing.M) {
	if len(os.Args) == 4 && os.Args[1] == "daemon" {
		l := paths.Layout{Root: os.Getenv(paths.EnvHome)}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		var err error
		switch os.Args[2] {
		case "run":
			err = RunFilters(ctx, l, os.Args[3], os.Stderr, nil)
		case "supervise":
			exe, xerr := os.Executable()
			if xerr != nil {
				err = xerr
				break
			}
			err = Supervise(ctx, l, exe, os.Args[3], os.Stderr)
		}
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// children returns the pids whose parent is ppid.
func children(t *testing.T, ppid int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) > 1 && f[0] != "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The supervisor binds GATEWAY:53 and the proxy port once and hands them to
// every filter process: while a crashed filter process is restarted, no
// other local process can bind them; the new process serves on them; and a
// filter process dies with its supervisor. Status says "up" only when the
// API answers.
func TestSupervisorHoldsSocketsAcrossRestarts(t *testing.T) {
	need.Root(t, "binds port 53")
	up := fakedns.StartT(t).Add("allowed.example.com. 60 IN A 93.184.215.14")
	root, err := os.MkdirTemp("", "abox-sv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	l := paths.Layout{Root: root}
	// A loopback gateway of its own, so port 53 is free whatever the host runs.
	gw := netip.AddrFrom4([4]byte{127, 77, byte(os.Getpid() >> 8), byte(os.Getpid()%250 + 2)})
	probe, err := net.Listen("tcp", net.JoinHostPort(gw.String(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	proxyPort := uint16(probe.Addr().(*net.TCPAddr).Port)
	probe.Close()
	st := validState(State{Name: "sv", Gateway: gw, ProxyPort: proxyPort, Upstreams: []string{up.Addr}})
	f := l.Instance(st.Name)
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Allowlist, []byte("allowed.example.com\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Save(l, st); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d := &ProcessDaemon{Layout: l, Exe: exe}
	ctx := context.Background()
	if err := d.Start(ctx, st); err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { d.Stop(ctx, st.Name) })
	sup := d.PID(st.Name)
	if sup == 0 || d.Filters(ctx, st.Name) != FiltersUp {
		t.Fatalf("after Start: supervisor %d, filters %s", sup, d.Filters(ctx, st.Name))
	}
	kids := children(t, sup)
	if len(kids) != 1 {
		t.Fatalf("supervisor %d has children %v, want one filter process", sup, kids)
	}
	first := kids[0]
	dnsAddr, httpAddr := FilterAddrs(st)

	syscall.Kill(first, syscall.SIGKILL)
	sawRestarting := false
	var taken []string
	waitFor(t, "a new filter process to answer", func() bool {
		if pc, err := net.ListenPacket("udp", dnsAddr); err == nil {
			pc.Close()
			taken = append(taken, "udp "+dnsAddr)
		}
		for _, a := range []string{dnsAddr, httpAddr} {
			if ln, err := net.Listen("tcp", a); err == nil {
				ln.Close()
				taken = append(taken, "tcp "+a)
			}
		}
		switch d.Filters(ctx, st.Name) {
		case FiltersRestarting:
			sawRestarting = true
		case FiltersUp:
			k := children(t, sup)
			return sawRestarting && len(k) == 1 && k[0] != first
		}
		return false
	})
	if len(taken) > 0 {
		t.Fatalf("while the filter process restarted, another process could bind %v", taken)
	}

	// The new process serves on the handed-over socket.
	c := &dns.Client{Timeout: 30 * time.Second}
	r, _, err := c.Exchange(new(dns.Msg).SetQuestion("allowed.example.com.", dns.TypeA), dnsAddr)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("query through the restarted filter: %v, %v", r, err)
	}
	// The supervisor told the new process it is a restart.
	text, err := api.NewClient(l.APISocket(st.Name)).Metrics(ctx)
	if want := `abox_filter_restarts_total{instance="sv",layer="daemon"} 1` + "\n"; err != nil || !strings.Contains(string(text), want) {
		t.Errorf("metrics after one restart: %v, want %q in:\n%s", err, want, text)
	}

	// A filter process dies with its supervisor.
	second := children(t, sup)[0]
	syscall.Kill(sup, syscall.SIGKILL)
	waitFor(t, "the filter process to die with its supervisor", func() bool {
		return !alive(second)
	})
	if got := d.Filters(ctx, st.Name); got != FiltersDown {
		t.Errorf("filters = %s after the supervisor died, want %s", got, FiltersDown)
	}
}
