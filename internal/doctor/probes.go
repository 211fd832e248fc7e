package doctor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/policy"
)

// probe is one command run in the guest and how to judge its outcome.
type probe struct {
	name string
	// cmd is a shell command line; its exit status and output are judged.
	cmd string
	// judge returns the status and detail from exit status and output.
	judge func(rc int, out string) (Status, string)
	fix   string
}

// proxyProbeSecs caps the probes the proxy answers (curl -m); the whole
// run has 40 s.
const proxyProbeSecs = "20"

// gatewayPorts are ports probed on the gateway besides DNS (UDP and TCP)
// and the proxy: the host's usual services.
var gatewayPorts = []int{22, 80, 443, 5300, 8080, 8081}

// probes builds the negative probes (and two positive controls that keep the
// negative ones honest: a probe that "fails to connect" proves nothing when
// nothing works at all).
func probes(in Instance, passive bool) []probe {
	st := in.State
	gw := st.Gateway.String()
	px := fmt.Sprintf("http://%s:%d", gw, st.ProxyPort)
	// A name no allowlist can hold: a random label right below a TLD
	// (a wildcard over a TLD is refused).
	var b [6]byte
	rand.Read(b[:])
	offList := "abox-doctor-" + hex.EncodeToString(b[:]) + ".invalid"
	probeIP, resolver := in.ProbeIP, in.ProbeResolver
	if probeIP == "" {
		probeIP = DefaultProbeIP
	}
	if resolver == "" {
		resolver = DefaultProbeResolver
	}
	// The proxy answers these itself or refuses at once; the generous cap
	// only matters on a slow guest (TCG on a busy host, where all probes
	// start at once), which must not read as a failed layer.
	curlP := "curl -sS -m " + proxyProbeSecs + " --noproxy '' -x " + px + " -o /dev/null -D - "
	fixLayers := "run abox doctor again after fixing the host-side failures above; if they all pass, the guest's own configuration differs from what abox set up"
	blockedByPassive := func(s Status, d string) (Status, string) {
		if passive && s == Fail {
			return Warn, d + " (the instance is in passive or learn mode, which allows every name)"
		}
		return s, d
	}
	ps := []probe{
		{
			name: "dns works (control)",
			cmd:  "dig +short +tries=2 +time=2 @" + gw + " " + policy.HealthcheckName,
			judge: func(rc int, out string) (Status, string) {
				if rc == 0 && hasLine(out, "127.0.0.1") {
					return Pass, "the gateway answers " + policy.HealthcheckName
				}
				return Fail, fmt.Sprintf("no answer from %s:53 (exit %d): %s", gw, rc, out)
			},
			fix: "abox start " + st.Name + "; check the guest's resolver points at " + gw,
		},
		{
			name: "CA installed (https healthcheck verifies)",
			cmd:  "curl -sS -m " + proxyProbeSecs + " --noproxy '' -x " + px + " -o /dev/null -w '%{http_code}' https://" + policy.HealthcheckName + "/",
			judge: func(rc int, out string) (Status, string) {
				switch {
				case rc == 0 && strings.Contains(out, "200"):
					return Pass, "the guest trusts the instance CA"
				case rc == 60 || rc == 35:
					return Fail, "TLS verification failed: the instance CA is not trusted in the guest: " + out
				}
				return Fail, fmt.Sprintf("exit %d: %s", rc, out)
			},
			fix: "in the guest: install " + "the instance CA (ca/ca.crt in the instance directory) into /usr/local/share/ca-certificates and run update-ca-certificates",
		},
		{
			name: "off-allowlist name gets NXDOMAIN",
			cmd:  "dig +tries=2 +time=2 @" + gw + " " + offList,
			judge: func(rc int, out string) (Status, string) {
				if strings.Contains(out, "status: NXDOMAIN") && strings.Contains(out, allowlist.ReasonNotAllowlisted) {
					return Pass, offList + ": NXDOMAIN, " + allowlist.ReasonNotAllowlisted
				}
				return blockedByPassive(Fail, fmt.Sprintf("%s: not refused by the DNS filter (exit %d): %s", offList, rc, firstLines(out, 3)))
			},
			fix: fixLayers,
		},
		{
			name: "off-allowlist URL gets 403",
			cmd:  curlP + "http://" + offList + "/",
			judge: func(rc int, out string) (Status, string) {
				return blockedByPassive(refused(out, allowlist.ReasonNotAllowlisted))
			},
			fix: fixLayers,
		},
		{
			name: "private address through the proxy refused",
			cmd:  curlP + "http://" + privateProbe(in) + "/",
			judge: func(rc int, out string) (Status, string) {
				return refused(out, "")
			},
			fix: "private ranges are refused unless allowed with --allow-private; " + fixLayers,
		},
		{
			name: "metadata address through the proxy refused",
			cmd:  curlP + "http://169.254.169.254/latest/meta-data/",
			judge: func(rc int, out string) (Status, string) {
				return refused(out, string(netclass.Metadata))
			},
			fix: fixLayers,
		},
		{
			name: "direct connection to a public address fails",
			cmd:  "curl -sS -m 3 --noproxy '*' -o /dev/null http://" + probeIP + "/",
			judge: func(rc int, out string) (Status, string) {
				return mustNotConnect(rc, out, probeIP+":80")
			},
			fix: "the packet filter or the host chains let the guest out: abox restart " + st.Name,
		},
		{
			name: "ping to a public address fails",
			cmd:  "ping -n -c 1 -W 2 " + probeIP,
			judge: func(rc int, out string) (Status, string) {
				if rc == 0 {
					return Fail, probeIP + " answered a ping: the guest reaches the internet directly"
				}
				if rc == 127 {
					return Skip, "ping is not installed in the guest"
				}
				return Pass, "no reply from " + probeIP
			},
			fix: "the packet filter lets ICMP out: abox restart " + st.Name,
		},
		{
			name: "third-party resolver unreachable",
			cmd:  "dig +short +tries=1 +time=2 @" + resolver + " " + policy.HealthcheckName,
			judge: func(rc int, out string) (Status, string) {
				if rc == 127 {
					return Skip, "dig is not installed in the guest"
				}
				if rc == 0 && strings.TrimSpace(out) != "" && !strings.Contains(out, "timed out") && !strings.Contains(out, "couldn't get address") {
					return Fail, resolver + " answered: the guest can bypass the DNS filter"
				}
				return Pass, "no answer from " + resolver + ":53"
			},
			fix: "the packet filter lets DNS to other servers out: abox restart " + st.Name,
		},
	}
	files, vars := cloudinit.ProxySettings(px)
	ps = append(ps, probe{
		name: "guest tools set for the proxy",
		cmd:  toolsProbe(px, files, vars),
		judge: func(rc int, out string) (Status, string) {
			missing := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "missing:"))
			if rc == 0 && strings.HasPrefix(strings.TrimSpace(out), "missing:") && missing == "" {
				return Pass, "shells, apt, pip, npm, git, cargo, the JVM and Node point at " + px + " and the instance CA"
			}
			// Isolation holds either way (a tool without the proxy reaches
			// nothing), but that tool will not work.
			return Warn, "not set up for the proxy: " + firstLines(out, 1)
		},
		fix: "the seed wrote these on first boot; restore them from a new instance (abox create) or set them by hand to " + px,
	})
	for _, p := range gatewayPorts {
		if p == int(st.ProxyPort) {
			continue
		}
		target := gw + ":" + strconv.Itoa(p)
		ps = append(ps, probe{
			name: "gateway port " + strconv.Itoa(p) + "/tcp closed",
			cmd:  "curl -sS -m 3 --noproxy '*' telnet://" + target + " </dev/null",
			judge: func(rc int, out string) (Status, string) {
				return mustNotConnect(rc, out, target)
			},
			fix: "the packet filter and the host INPUT chain must drop it: abox restart " + st.Name,
		})
	}
	return ps
}

// toolsProbe prints "missing:" followed by every file that no longer
// mentions the proxy and every variable the session lacks.
func toolsProbe(px string, files, vars []string) string {
	var b strings.Builder
	b.WriteString("m=; for f in")
	for _, f := range files {
		b.WriteString(" " + shellQuote(f))
	}
	b.WriteString("; do grep -qsF -- " + shellQuote(px) + ` "$f" || m="$m $f"; done; for v in`)
	for _, v := range vars {
		b.WriteString(" " + v)
	}
	b.WriteString(`; do eval "x=\${$v-}"; [ -n "$x" ] || m="$m \$$v"; done; echo "missing:$m"`)
	return b.String()
}

// privateProbe is an RFC 1918 address that the instance has not allowed.
func privateProbe(in Instance) string {
	for _, c := range []string{"10.0.0.1", "172.16.0.1", "192.168.0.1"} {
		a := netip.MustParseAddr(c)
		allowed := false
		for _, p := range in.State.AllowPrivate {
			if p.Contains(a) {
				allowed = true
			}
		}
		if !allowed {
			return c
		}
	}
	return "192.168.255.254"
}

// refused judges curl -D - output: a 403 from the proxy with the reason
// (any reason when reason is empty: a private address may be refused as
// private, or as a host or instance network, which are narrower).
func refused(out, reason string) (Status, string) {
	low := strings.ToLower(out)
	const h = "x-abox-reason: "
	i := strings.Index(low, h)
	if !strings.Contains(out, " 403") || i < 0 {
		return Fail, "not refused with a 403 from the proxy: " + firstLines(out, 3)
	}
	got := strings.Fields(low[i+len(h):] + " ")[0]
	if reason != "" && got != reason {
		return Fail, "refused as " + got + ", want " + reason
	}
	return Pass, "403, " + got
}

// mustNotConnect judges a connection attempt that must fail.
func mustNotConnect(rc int, out, target string) (Status, string) {
	switch rc {
	case 0:
		return Fail, target + " accepted a connection"
	case 127:
		return Skip, "curl is not installed in the guest"
	case 7:
		return Pass, target + ": refused at once"
	case 28:
		// Isolation holds, but the host's answer table (hostfw) should
		// have refused the flow at once: clients wait out their timeout.
		return Warn, target + ": dropped without an answer (timed out); the host's answer table refuses such flows at once, see the hostfw check"
	}
	return Pass, fmt.Sprintf("%s: no connection (curl exit %d)", target, rc)
}

// script runs every probe at once and prints "index<TAB>rc<TAB>output"
// lines, the output flattened to one line and cut short.
func script(ps []probe) string {
	var b strings.Builder
	b.WriteString("export LC_ALL=C\n")
	b.WriteString("p() { i=$1; shift; o=$(sh -c \"$1\" 2>&1); r=$?; o=$(printf '%s' \"$o\" | tr '\\n\\t\\r' '   ' | cut -c1-600); printf '%s\\t%s\\t%s\\n' \"$i\" \"$r\" \"$o\"; }\n")
	for i, p := range ps {
		fmt.Fprintf(&b, "p %d %s &\n", i, shellQuote(p.cmd))
	}
	b.WriteString("wait\n")
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func guestProbes(ctx context.Context, in Instance, apiUp bool, r *Report) {
	passive := false
	if apiUp {
		if s, err := in.Filters.Status(ctx); err == nil && (s.Mode == policy.Passive || s.Mode == policy.Learn) {
			passive = true
		}
	}
	ps := probes(in, passive)
	gctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	out, err := in.Guest(gctx, script(ps))
	results := map[int][2]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.SplitN(line, "\t", 3)
		if len(f) < 2 {
			continue
		}
		i, e1 := strconv.Atoi(f[0])
		if e1 != nil || i < 0 || i >= len(ps) {
			continue
		}
		o := ""
		if len(f) == 3 {
			o = f[2]
		}
		results[i] = [2]string{f[1], o}
	}
	if len(results) == 0 {
		detail := "no probe ran"
		if err != nil {
			detail = err.Error()
		}
		r.add(Check{Layer: "guest", Name: "ssh", Status: Fail, Detail: detail + ": " + firstLines(string(out), 3),
			Fix: "wait for the guest to boot (abox ssh " + in.State.Name + " -- true), or check its serial log " + in.Files.SerialLog})
		return
	}
	for i, p := range ps {
		res, ok := results[i]
		if !ok {
			r.add(Check{Layer: "guest", Name: p.name, Status: Fail, Detail: "the probe did not report (ssh ended early?)", Fix: p.fix})
			continue
		}
		rc, _ := strconv.Atoi(res[0])
		s, d := p.judge(rc, res[1])
		c := Check{Layer: "guest", Name: p.name, Status: s, Detail: d}
		if s != Pass {
			c.Fix = p.fix
		}
		r.add(c)
	}
}

func hasLine(out, want string) bool {
	for _, l := range strings.Fields(out) {
		if l == want {
			return true
		}
	}
	return false
}

func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, " | ")
}
