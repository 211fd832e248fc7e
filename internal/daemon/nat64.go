package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/netclass"
	"github.com/abox-dev/abox/internal/upstream"
)

// nat64Refresh is how often the NAT64 prefixes are asked for again: a
// laptop moves between networks.
const nat64Refresh = 5 * time.Minute

// discoverNAT64 learns the host network's NAT64 prefixes the RFC 7050 way
// until ctx ends: it asks the upstream for the AAAA records of ipv4only.arpa
// (which only a DNS64 resolver synthesises) at once and then every
// nat64Refresh, and hands what they embed to n, which both filters' address
// policies share. An address under a network-specific prefix is then judged
// as the IPv4 address the NAT64 gateway would reach for it, private ones
// included (netclass.NAT64). A failed lookup keeps the prefixes known.
func discoverNAT64(ctx context.Context, ex upstream.Exchanger, n *netclass.NAT64, log *slog.Logger) {
	for {
		if ps, ok := lookupNAT64(ctx, ex); ok && !slices.Equal(ps, n.Prefixes()) {
			n.Set(ps)
			strs := make([]string, len(ps))
			for i, p := range ps {
				strs[i] = p.String()
			}
			log.Info("nat64 prefixes", "prefixes", strs)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(nat64Refresh):
		}
	}
}

// lookupNAT64 asks for ipv4only.arpa AAAA once; ok is false when no answer
// came (the prefixes known stay in force).
func lookupNAT64(ctx context.Context, ex upstream.Exchanger) ([]netip.Prefix, bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := new(dns.Msg)
	m.SetQuestion("ipv4only.arpa.", dns.TypeAAAA)
	m.SetEdns0(upstream.DefaultUDPSize, false)
	r, _, err := ex.Exchange(ctx, m)
	if err != nil {
		return nil, false
	}
	switch r.Rcode {
	case dns.RcodeSuccess, dns.RcodeNameError:
	default:
		return nil, false
	}
	return netclass.PrefixesFromIPv4Only(upstream.ChainAddrs("ipv4only.arpa.", dns.TypeAAAA, r.Answer)), true
}
