package project

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/config"
	"github.com/abox-dev/abox/internal/guest"
	"github.com/abox-dev/abox/internal/httpfilter"
	"github.com/abox-dev/abox/internal/policy"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/termtext"
)

// syncAllowlist makes the running instance's allowlist the file's, line by
// line: what is missing is added, what the file no longer has is removed
// (a rule line by itself). Removals go first: a name that changes from no
// rules to rules, or back, is refused by add while the other form is
// listed, and the list in between is narrower than both, never wider.
func syncAllowlist(ctx context.Context, c *api.Client, want []string) ([]string, error) {
	cur, err := c.Allowlist(ctx)
	if err != nil {
		return nil, err
	}
	lines := cur.Lines
	if lines == nil {
		lines = cur.Entries // filters of an abox before rules
	}
	have := map[string]bool{}
	for _, e := range lines {
		have[e] = true
	}
	wanted := map[string]bool{}
	var add, remove []string
	for _, e := range want {
		wanted[e] = true
		if !have[e] {
			add = append(add, e)
		}
	}
	for _, e := range lines {
		if !wanted[e] {
			remove = append(remove, e)
		}
	}
	var applied []string
	if len(remove) > 0 {
		if _, err := c.AllowlistRemove(ctx, remove); err != nil {
			return nil, err
		}
		for _, e := range remove {
			applied = append(applied, "allowlist -"+e)
		}
	}
	if len(add) > 0 {
		if _, err := c.AllowlistAdd(ctx, add); err != nil {
			return applied, err
		}
		for _, e := range add {
			applied = append(applied, "allowlist +"+e)
		}
	}
	return applied, nil
}

// provision runs the file's overlay and scripts in active mode (a
// provisioning run must never be the moment the guest reaches everything)
// and returns what the filters refused meanwhile.
func provision(ctx context.Context, d Deps, p *config.Project, t guest.Target) ([]Blocked, error) {
	c := d.api(p.Name)
	if err := c.SetMode(ctx, policy.Active); err != nil {
		return nil, fmt.Errorf("provisioning %s: setting active mode: %w", p.Name, err)
	}
	marks := map[string]uint64{}
	for _, comp := range []string{"dns", "http"} {
		b, err := c.Logs(ctx, comp, 0, 0)
		if err != nil {
			return nil, fmt.Errorf("provisioning %s: reading the %s log: %w", p.Name, comp, err)
		}
		marks[comp] = b.Seq
	}
	var plan guest.Plan
	if p.Overlay != "" {
		sub, err := p.Root.OpenRoot(p.Overlay)
		if err != nil {
			return nil, fmt.Errorf("%s: provision.overlay: %w", p.Path, err)
		}
		defer sub.Close()
		plan.Overlay = &guest.Overlay{FS: sub.FS(), Source: p.Overlay}
	}
	for _, s := range p.Scripts {
		sc, err := guest.ReadScript(p.Root, s)
		if err != nil {
			return nil, fmt.Errorf("%s: provision.scripts: %w", p.Path, err)
		}
		plan.Scripts = append(plan.Scripts, sc)
	}
	perr := guest.Provision(ctx, t, plan, d.Out, d.Progress)
	blocked, lerr := blockedSince(context.WithoutCancel(ctx), c, marks)
	if perr != nil {
		return blocked, perr
	}
	return blocked, lerr
}

// decision is the part of a DNS or HTTP decision line this reads.
type decision struct {
	Verdict string `json:"verdict"`
	Reason  string `json:"reason"`
	Name    string `json:"name"` // dns
	Host    string `json:"host"` // http
	Port    int    `json:"port"` // http
	// Method and Path (the request-target, query included) of an http
	// request a rule refused.
	Method string `json:"method"`
	Path   string `json:"path"`
}

// blockedSince collects the refusals logged after marks, one per target.
func blockedSince(ctx context.Context, c *api.Client, marks map[string]uint64) ([]Blocked, error) {
	seen := map[string]bool{}
	var out []Blocked
	for _, comp := range []string{"dns", "http"} {
		n, since := 0, marks[comp]
		if since == 0 {
			n = 10000
		}
		b, err := c.Logs(ctx, comp, n, since)
		if err != nil {
			return out, err
		}
		for _, raw := range b.Lines {
			var dc decision
			if json.Unmarshal(raw, &dc) != nil || dc.Verdict != string(allowlist.Block) {
				continue
			}
			bl := blockedOf(comp, dc)
			if bl.Target == "" || seen[comp+bl.Target+bl.Reason] {
				continue
			}
			seen[comp+bl.Target+bl.Reason] = true
			out = append(out, bl)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out, nil
}

// blockedOf names the fix for one refusal: an allowlist entry for a name
// not on the list, a port for the port policy; nothing for the address
// classes the filters refuse whatever the file says. The target is what
// the guest asked for, so it is made safe for the terminal up prints it on.
func blockedOf(comp string, dc decision) Blocked {
	b := Blocked{Component: comp, Reason: termtext.Clean(dc.Reason), Target: termtext.Clean(dc.Name)}
	if comp == "http" {
		b.Target = termtext.Clean(dc.Host)
		if dc.Port != 0 {
			b.Target = fmt.Sprintf("%s:%d", b.Target, dc.Port)
		}
	}
	switch dc.Reason {
	case allowlist.ReasonNotAllowlisted:
		host := dc.Name
		if comp == "http" {
			host = dc.Host
		}
		if e, err := allowlist.ParseEntry(host); err == nil {
			b.Fix = fmt.Sprintf("allowlist: [%s]", e)
		}
	case httpfilter.ReasonPortNotAllowed:
		b.Fix = fmt.Sprintf("ports: [%d]", dc.Port)
	case reqrules.ReasonMethodNotAllowed, reqrules.ReasonPathNotAllowed:
		// A rule for the exact request, on the entry that refused it: a
		// new exact item would decide the host instead of a wildcard's.
		// Only a rule that parses is named, so the guest's method and
		// path reach the terminal as a canonical rule or not at all.
		e, err := allowlist.ParseEntry(dc.Host)
		if err != nil {
			break
		}
		p, _, _ := strings.Cut(dc.Path, "?")
		canon, err := reqrules.Normalize(p)
		if err != nil {
			break
		}
		if r, err := reqrules.ParseRule(dc.Method + " " + canon); err == nil && len(r.Methods()) == 1 {
			b.Fix = fmt.Sprintf("the rule %q to the allowlist entry that decides %s (abox explain %s tells which)", r.String(), e, e)
		}
	}
	return b
}
