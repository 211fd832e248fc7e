package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
	"libvirt.org/go/libvirtxml"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/hostfw"
	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/policy"
)

// Hypervisor is the read-only view of libvirt doctor needs.
type Hypervisor interface {
	State(ctx context.Context, domain string) (libvirt.DomainState, error)
	DomainNICs(ctx context.Context, domain string, live bool) ([]libvirt.NIC, error)
	NWFilterBindings(ctx context.Context) (map[string]string, error)
	NWFilter(ctx context.Context, name string) (*libvirtxml.NWFilter, error)
}

// Firewall checks the host chains of a bridge, the guest's tap on it
// (hostfw.Port), and the kernel rules libvirt's nwfilter keeps for a tap.
type Firewall interface {
	Check(ctx context.Context, b hostfw.Bridge) (hostfw.Status, error)
	CheckPort(ctx context.Context, p hostfw.Port) (hostfw.Status, error)
	CheckNWFilter(ctx context.Context, tap string) (hostfw.Status, error)
}

// Filters is the instance's local API.
type Filters interface {
	Status(ctx context.Context) (api.Status, error)
}

// Guest runs a shell script in the guest (over SSH) and returns its stdout,
// of which it keeps at most MaxGuestOutput bytes (failing past that): the
// guest is the one answering.
type Guest func(ctx context.Context, script string) ([]byte, error)

// MaxGuestOutput bounds a guest's answer to the probes.
const MaxGuestOutput = 1 << 20

// Instance is everything doctor looks at for one instance.
type Instance struct {
	State instance.State
	Files paths.Instance
	// Filter is the nwfilter abox defines for the instance (built from
	// State), against which the defined one is compared.
	Filter     *libvirtxml.NWFilter
	Hypervisor Hypervisor
	Firewall   Firewall
	Filters    Filters
	// Guest is nil to skip the probes from inside the guest.
	Guest Guest
	// DNSAddr and ProxyAddr override where the filters are asked (tests);
	// empty means the gateway's port 53 and proxy port.
	DNSAddr, ProxyAddr string
	// ProbeIP is a public address the guest must not reach directly, and
	// ProbeResolver a third-party resolver it must not reach.
	ProbeIP, ProbeResolver string
}

// Defaults for the probes: well-known anycast addresses. A sandbox that
// reaches them is broken; one that does not sends nothing anywhere.
const (
	DefaultProbeIP       = "1.1.1.1"
	DefaultProbeResolver = "9.9.9.9"
)

// Doctor checks every layer of a running instance from the host, then runs
// negative probes from inside the guest. Checks that depend on a missing
// layer are skipped, not failed twice.
func Doctor(ctx context.Context, in Instance) Report {
	t0 := time.Now()
	var r Report
	st := in.State
	dom := libvirt.DomainName(st.Name)

	running := false
	ds, err := in.Hypervisor.State(ctx, dom)
	switch {
	case err != nil:
		r.add(Check{Layer: "vm", Name: "domain running", Status: Fail, Detail: err.Error(), Fix: "abox start " + st.Name})
	case !ds.Active():
		r.add(Check{Layer: "vm", Name: "domain running", Status: Fail, Detail: "domain is " + string(ds), Fix: "abox start " + st.Name})
	default:
		running = true
		r.add(Check{Layer: "vm", Name: "domain running", Status: Pass, Detail: string(ds)})
	}

	nwfilterChecks(ctx, in, running, &r)
	hostfwChecks(ctx, in, &r)
	apiUp := daemonChecks(ctx, in, &r)
	logChecks(in, &r)
	if in.Guest == nil {
		r.TookMS = since(t0)
		return r
	}
	if !running {
		r.add(Check{Layer: "guest", Name: "probes", Status: Skip, Detail: "the guest is not running"})
	} else {
		guestProbes(ctx, in, apiUp, &r)
	}
	r.TookMS = since(t0)
	return r
}

func nwfilterChecks(ctx context.Context, in Instance, running bool, r *Report) {
	st := in.State
	want := libvirt.FilterName(st.Name)
	fix := "abox restart " + st.Name + " (start redefines the nwfilter from the instance's state and binds it to the new interface)"

	nf, err := in.Hypervisor.NWFilter(ctx, want)
	switch {
	case err != nil:
		r.add(Check{Layer: "nwfilter", Name: "filter defined", Status: Fail, Detail: err.Error(), Fix: fix})
	case in.Filter != nil && !libvirt.SameNWFilterRules(nf, in.Filter):
		r.add(Check{Layer: "nwfilter", Name: "filter defined", Status: Fail,
			Detail: fmt.Sprintf("%s holds %d rules that differ from abox's policy (%d rules): edited outside abox", want, len(nf.Entries), len(in.Filter.Entries)), Fix: fix})
	default:
		r.add(Check{Layer: "nwfilter", Name: "filter defined", Status: Pass, Detail: fmt.Sprintf("%s, %d rules as abox defines them", want, len(nf.Entries))})
	}

	persistent, err := in.Hypervisor.DomainNICs(ctx, libvirt.DomainName(st.Name), false)
	if err != nil {
		r.add(Check{Layer: "nwfilter", Name: "persistent definition references it", Status: Fail, Detail: err.Error(), Fix: fix})
	} else if bad := nicsWithout(persistent, want); len(persistent) == 0 || len(bad) > 0 {
		r.add(Check{Layer: "nwfilter", Name: "persistent definition references it", Status: Fail,
			Detail: "interfaces without filterref " + want + ": " + describeNICs(bad, persistent), Fix: fix})
	} else {
		r.add(Check{Layer: "nwfilter", Name: "persistent definition references it", Status: Pass})
	}
	noRules := Check{Layer: "nwfilter", Name: nwfilterRulesCheck, Status: Skip, Detail: "no binding of " + want + " to look at"}
	if !running {
		r.add(Check{Layer: "nwfilter", Name: "bound on the live interface", Status: Skip, Detail: "the guest is not running"})
		noRules.Detail = "the guest is not running"
		r.add(noRules)
		return
	}
	live, err := in.Hypervisor.DomainNICs(ctx, libvirt.DomainName(st.Name), true)
	if err != nil {
		r.add(Check{Layer: "nwfilter", Name: "bound on the live interface", Status: Fail, Detail: err.Error(), Fix: fix})
		r.add(noRules)
		return
	}
	bindings, err := in.Hypervisor.NWFilterBindings(ctx)
	if err != nil {
		r.add(Check{Layer: "nwfilter", Name: "bound on the live interface", Status: Fail, Detail: err.Error(), Fix: fix})
		r.add(noRules)
		return
	}
	var problems []string
	for _, n := range live {
		switch {
		case n.Target == "":
			problems = append(problems, "an interface ("+n.MAC+") has no host device")
		case bindings[n.Target] != want:
			got := bindings[n.Target]
			if got == "" {
				got = "no filter"
			}
			problems = append(problems, fmt.Sprintf("%s (%s) is bound to %s", n.Target, n.MAC, got))
		}
	}
	if len(live) == 0 {
		problems = append(problems, "the running domain has no interface")
	}
	if len(problems) > 0 {
		r.add(Check{Layer: "nwfilter", Name: "bound on the live interface", Status: Fail,
			Detail: strings.Join(problems, "; ") + ": the guest's packets are not filtered", Fix: fix})
		r.add(noRules)
		return
	}
	devs := make([]string, 0, len(live))
	for _, n := range live {
		devs = append(devs, n.Target)
	}
	r.add(Check{Layer: "nwfilter", Name: "bound on the live interface", Status: Pass, Detail: strings.Join(devs, ", ") + " → " + want})
	r.add(nwfilterRules(ctx, in, devs))
}

const nwfilterRulesCheck = "kernel rules in place"

// nwfilterRules checks that the kernel still holds the rules libvirt made
// for each binding (hostfw.CheckNWFilter): a flush of ebtables' nat table
// or iptables' filter table removes them while libvirt keeps listing the
// binding, so the check above passes and the guest runs without its
// layer-2 anti-spoofing and the nwfilter's stateful rules.
func nwfilterRules(ctx context.Context, in Instance, devs []string) Check {
	c := Check{Layer: "nwfilter", Name: nwfilterRulesCheck}
	var problems, fixes []string
	for _, dev := range devs {
		st, err := in.Firewall.CheckNWFilter(ctx, dev)
		switch {
		case err != nil:
			c.Status, c.Detail, c.Fix = Fail, err.Error(), "run abox doctor as root (it lists ebtables' nat and iptables' filter tables)"
			return c
		case !st.Intact():
			problems = append(problems, st.Problems...)
			fixes = append(fixes, hostfw.NWFilterFix(dev))
		}
	}
	if len(problems) > 0 {
		c.Status = Fail
		c.Detail = strings.Join(problems, "; ") + ": libvirt still lists the binding, but the kernel no longer applies it (a flush of ebtables' nat or iptables' filter table?)"
		c.Fix = strings.Join(fixes, "; ") + "; or abox restart " + in.State.Name
		return c
	}
	c.Status = Pass
	c.Detail = "ebtables libvirt-I-/libvirt-O-, iptables and ip6tables FI-/FO-/HI- chains of " + strings.Join(devs, ", ") + " jumped to, ending in DROP"
	return c
}

func nicsWithout(nics []libvirt.NIC, filter string) []libvirt.NIC {
	var out []libvirt.NIC
	for _, n := range nics {
		if n.FilterRef != filter {
			out = append(out, n)
		}
	}
	return out
}

func describeNICs(bad, all []libvirt.NIC) string {
	if len(all) == 0 {
		return "the definition has no interface"
	}
	var s []string
	for _, n := range bad {
		ref := n.FilterRef
		if ref == "" {
			ref = "none"
		}
		s = append(s, fmt.Sprintf("%s (filterref %s)", n.MAC, ref))
	}
	return strings.Join(s, ", ")
}

func hostfwChecks(ctx context.Context, in Instance, r *Report) {
	st := in.State
	c := Check{Layer: "hostfw", Name: "host chains present and first", Fix: "abox restart " + st.Name + " (start re-creates the host chains; find what inserted a foreign rule)"}
	// hostfw.Check is the one judge of the chains: their exact rules, and
	// jumps that come before every other rule of the built-in chains.
	fs, err := in.Firewall.Check(ctx, instance.FirewallBridge(st))
	switch {
	case err != nil:
		c.Status, c.Detail = Fail, err.Error()
	case !fs.Intact():
		c.Status, c.Detail = Fail, strings.Join(fs.Problems, "; ")
	default:
		c.Status, c.Fix = Pass, ""
		c.Detail = strings.Join([]string{hostfw.ChainName(st.Bridge), hostfw.InputChainName(st.Bridge), hostfw.OutputChainName(st.Bridge)}, ", ") + " intact, jumped to first; " +
			"nftables table ip " + hostfw.AnswerTableName(st.Bridge) + " answers refused flows"
	}
	r.add(c)
	p := Check{Layer: "hostfw", Name: "guest's tap on its bridge", Fix: "abox restart " + st.Name + " (the guard puts the tap back within its round: if it did not, the supervisor is down; see " + in.Files.DaemonLog + ")"}
	ps, err := in.Firewall.CheckPort(ctx, hostfw.Port{Bridge: st.Bridge, GuestMAC: st.MAC})
	switch {
	case err != nil:
		p.Status, p.Detail = Fail, err.Error()
	case !ps.Intact():
		p.Status, p.Detail = Fail, strings.Join(ps.Problems, "; ")
	default:
		p.Status, p.Fix = Pass, ""
		p.Detail = "a port of " + st.Bridge + ", dropped at the IP layer outside it"
	}
	r.add(p)
}

// daemonChecks checks the API, the mode, the allowlist and that the DNS
// filter and the proxy answer on the gateway. It reports whether the API
// answered.
func daemonChecks(ctx context.Context, in Instance, r *Report) bool {
	st := in.State
	fix := "abox start " + st.Name + " (brings back filters that died; see " + in.Files.DaemonLog + ")"
	actx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := in.Filters.Status(actx)
	if err != nil {
		r.add(Check{Layer: "daemon", Name: "api answering", Status: Fail, Detail: err.Error() + ": DNS and the proxy are down, the guest reaches nothing", Fix: fix})
		r.add(Check{Layer: "daemon", Name: "dns and proxy", Status: Skip, Detail: "the daemon is down"})
		return false
	}
	r.add(Check{Layer: "daemon", Name: "api answering", Status: Pass, Detail: in.Files.APISocket})
	if s.Mode == policy.Passive {
		r.add(Check{Layer: "daemon", Name: "mode", Status: Warn, Detail: "passive: every name is allowed and recorded",
			Fix: "abox net filter " + st.Name + " active (never run untrusted workloads in passive mode)"})
	} else if s.Mode == policy.Learn {
		r.add(Check{Layer: "daemon", Name: "mode", Status: Warn, Detail: "learn: every public name is allowed and every request recorded",
			Fix: "abox net learn stop " + st.Name + " once the workload has run (abox net propose " + st.Name + " makes its allowlist)"})
	} else {
		r.add(Check{Layer: "daemon", Name: "mode", Status: Pass, Detail: string(s.Mode)})
	}
	if s.Allowlist.LastError != "" {
		r.add(Check{Layer: "daemon", Name: "allowlist", Status: Warn, Detail: "last reload rejected (previous list in force): " + s.Allowlist.LastError,
			Fix: "fix " + s.Allowlist.Path + " (abox allowlist check FILE), then abox allowlist reload " + st.Name})
	} else {
		r.add(Check{Layer: "daemon", Name: "allowlist", Status: Pass, Detail: fmt.Sprintf("%d entries from %s", s.Allowlist.Entries, s.Allowlist.Path)})
	}
	if tr := s.Trouble(); len(tr) > 0 {
		r.add(Check{Layer: "daemon", Name: "logs and saved policy", Status: Warn,
			Detail: strings.Join(tr, "; ") + " (the filters enforce the policy in force meanwhile)",
			Fix:    "free space or fix permissions of " + in.Files.LogsDir + " and " + s.Allowlist.Path + ", then abox allowlist reload " + st.Name + " (a reload writes an unsaved change)"})
	} else {
		r.add(Check{Layer: "daemon", Name: "logs and saved policy", Status: Pass, Detail: "decision logs written, policy saved"})
	}
	dnsAddr, proxyAddr := in.DNSAddr, in.ProxyAddr
	if dnsAddr == "" {
		dnsAddr = net.JoinHostPort(st.Gateway.String(), "53")
	}
	if proxyAddr == "" {
		proxyAddr = net.JoinHostPort(st.Gateway.String(), strconv.Itoa(int(st.ProxyPort)))
	}
	r.add(dnsAnswers(ctx, st, dnsAddr))
	r.add(proxyAnswers(ctx, st, proxyAddr))
	return true
}

func dnsAnswers(ctx context.Context, st instance.State, addr string) Check {
	c := Check{Layer: "dns", Name: "filter answering", Fix: "abox start " + st.Name}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(policy.HealthcheckName), dns.TypeA)
	cl := &dns.Client{Timeout: time.Second}
	var resp *dns.Msg
	var err error
	for range 3 { // UDP: a lost datagram is not a dead filter
		if resp, _, err = cl.ExchangeContext(ctx, m, addr); err == nil {
			break
		}
	}
	if err != nil {
		c.Status, c.Detail = Fail, fmt.Sprintf("%s: %v", addr, err)
		return c
	}
	for _, a := range resp.Answer {
		if ar, ok := a.(*dns.A); ok && ar.A.String() == "127.0.0.1" {
			c.Status, c.Detail, c.Fix = Pass, addr+" answers "+policy.HealthcheckName, ""
			return c
		}
	}
	c.Status, c.Detail = Fail, fmt.Sprintf("%s answered %s without 127.0.0.1 for %s", addr, dns.RcodeToString[resp.Rcode], policy.HealthcheckName)
	return c
}

func proxyAnswers(ctx context.Context, st instance.State, addr string) Check {
	c := Check{Layer: "proxy", Name: "filter answering", Fix: "abox start " + st.Name}
	pu := &url.URL{Scheme: "http", Host: addr}
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+policy.HealthcheckName+"/", nil)
	resp, err := hc.Do(req)
	if err != nil {
		c.Status, c.Detail = Fail, fmt.Sprintf("%s: %v", addr, err)
		return c
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Abox-Reason") != policy.ReasonHealthcheck {
		c.Status, c.Detail = Fail, fmt.Sprintf("%s answered %s (reason %q) for the healthcheck", addr, resp.Status, resp.Header.Get("X-Abox-Reason"))
		return c
	}
	c.Status, c.Detail, c.Fix = Pass, addr+" answers the healthcheck", ""
	return c
}

func logChecks(in Instance, r *Report) {
	dir := in.Files.LogsDir
	c := Check{Layer: "logs", Name: "writable", Fix: "check the permissions and free space of " + dir}
	f, err := os.CreateTemp(dir, ".doctor-*")
	if err != nil {
		c.Status, c.Detail = Fail, err.Error()
		r.add(c)
		return
	}
	name := f.Name()
	_, werr := f.WriteString("x")
	f.Close()
	os.Remove(name)
	if werr != nil {
		c.Status, c.Detail = Fail, werr.Error()
		r.add(c)
		return
	}
	var bad []string
	for _, p := range []string{in.Files.DNSLog, decisionlog.RefusalsPath(in.Files.DNSLog), in.Files.HTTPLog, decisionlog.RefusalsPath(in.Files.HTTPLog), in.Files.DaemonLog} {
		lf, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		lf.Close()
	}
	if len(bad) > 0 {
		c.Status, c.Detail = Fail, strings.Join(bad, "; ")
		r.add(c)
		return
	}
	c.Status, c.Detail, c.Fix = Pass, dir, ""
	r.add(c)
}
