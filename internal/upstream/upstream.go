// Package upstream is the filters' DNS client: it sends queries the filters
// built themselves to the configured resolvers, retransmitting lost UDP
// datagrams with backoff inside a per-server timeout, with TCP retry on
// truncation and failover in order.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/netclass"
)

// Defaults for Config fields left zero.
const (
	DefaultTimeout = 2 * time.Second
	// DefaultRetryInterval is the wait before the first retransmission of
	// an unanswered UDP query; each further wait doubles up to
	// maxRetryWait. With DefaultTimeout that is five sends (0, 0.15, 0.45,
	// 1.05, 1.65 s): the shape of every stub resolver's retry (glibc, Go's,
	// systemd-resolved), but starting sooner, because one lost datagram
	// must not cost seconds.
	DefaultRetryInterval = 150 * time.Millisecond
	// maxRetryWait caps the backoff so a long timeout still means many
	// tries, at most a few datagrams a second per query.
	maxRetryWait = 600 * time.Millisecond
	// DefaultUDPSize is the EDNS0 buffer size we advertise upstream: the
	// DNS Flag Day 2020 value, small enough to avoid IP fragmentation.
	DefaultUDPSize = 1232
	// DefaultResolvConf is where the host's resolvers are read from.
	DefaultResolvConf = "/etc/resolv.conf"
	// maxCNAMEChain bounds alias following in LookupNetIP.
	maxCNAMEChain = 16
)

// Config configures a Client.
type Config struct {
	// Servers are resolver addresses (host:port, or a bare IP meaning port
	// 53), tried in order. Empty means the host's resolvers (DefaultResolvConf).
	Servers []string
	// Timeout bounds one try against one server (UDP plus any TCP retry);
	// 0 means DefaultTimeout.
	Timeout time.Duration
	// RetryInterval is the wait before the first UDP retransmission to
	// one server, doubling after each; 0 means DefaultRetryInterval.
	RetryInterval time.Duration
	// UDPSize is the EDNS0 buffer size LookupNetIP advertises; 0 means DefaultUDPSize.
	UDPSize uint16
}

// Client sends queries to the upstream resolvers. It is safe for concurrent use.
type Client struct {
	// servers is non-empty, each entry a host:port.
	servers []string
	timeout time.Duration
	retry   time.Duration // > 0
	udpSize uint16
	tcp     *dns.Client
}

// New returns a client for cfg.Servers, or for the host's resolvers when
// none are given.
func New(cfg Config) (*Client, error) {
	servers := cfg.Servers
	if len(servers) == 0 {
		hs, err := HostServers(DefaultResolvConf)
		if err != nil {
			return nil, err
		}
		servers = hs
	}
	norm := make([]string, 0, len(servers))
	for _, s := range servers {
		a, err := ParseServer(s)
		if err != nil {
			return nil, err
		}
		norm = append(norm, a)
	}
	c := &Client{servers: norm, timeout: cfg.Timeout, retry: cfg.RetryInterval, udpSize: cfg.UDPSize}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.retry <= 0 {
		c.retry = DefaultRetryInterval
	}
	if c.udpSize == 0 {
		c.udpSize = DefaultUDPSize
	}
	c.tcp = &dns.Client{Net: "tcp", Timeout: c.timeout}
	return c, nil
}

// ParseServer validates a resolver address and returns it as host:port. A
// bare IP address means port 53. Host names are refused: resolving the
// resolver would need a resolver.
func ParseServer(s string) (string, error) {
	s = strings.TrimSpace(s)
	if ap, err := netip.ParseAddrPort(s); err == nil {
		if ap.Port() == 0 {
			return "", fmt.Errorf("upstream %q: port 0 is not a resolver port", s)
		}
		return ap.String(), nil
	}
	if a, err := netip.ParseAddr(strings.Trim(s, "[]")); err == nil {
		return netip.AddrPortFrom(a, 53).String(), nil
	}
	return "", fmt.Errorf("upstream %q: want IP or IP:PORT (for example 1.1.1.1:53 or [2606:4700::1111]:53)", s)
}

// HostServers reads the nameservers of a resolv.conf file.
func HostServers(path string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading host resolvers: %w (pass an upstream explicitly)", err)
	}
	if len(cc.Servers) == 0 {
		return nil, fmt.Errorf("reading host resolvers: no nameserver in %s (pass an upstream explicitly)", path)
	}
	out := make([]string, 0, len(cc.Servers))
	for _, s := range cc.Servers {
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	return out, nil
}

// Servers returns the resolver addresses in failover order.
func (c *Client) Servers() []string { return append([]string(nil), c.servers...) }

// Exchange sends m to the resolvers in order and returns the first usable
// answer and its round-trip time. A server that times out, fails, answers
// SERVFAIL or REFUSED, or answers a different question is skipped; if every
// server answered SERVFAIL/REFUSED the last such answer is returned. A
// truncated UDP answer is retried over TCP against the same server.
// m is not modified.
func (c *Client) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error) {
	if len(m.Question) != 1 {
		return nil, 0, errors.New("querying upstream: want exactly one question")
	}
	var errs []error
	var last *dns.Msg
	var lastRTT time.Duration
	for _, srv := range c.servers {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		r, rtt, err := c.try(ctx, m, srv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", srv, err))
			continue
		}
		if r.Rcode == dns.RcodeServerFailure || r.Rcode == dns.RcodeRefused {
			last, lastRTT = r, rtt
			errs = append(errs, fmt.Errorf("%s: answered %s", srv, dns.RcodeToString[r.Rcode]))
			continue
		}
		return r, rtt, nil
	}
	if last != nil {
		return last, lastRTT, nil
	}
	return nil, 0, fmt.Errorf("querying upstream for %s %s: %w", m.Question[0].Name, dns.TypeToString[m.Question[0].Qtype], errors.Join(errs...))
}

// try asks one server: UDP, then TCP if the answer was truncated.
func (c *Client) try(ctx context.Context, m *dns.Msg, srv string) (*dns.Msg, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	q := m.Copy()
	start := time.Now()
	r, err := c.udpExchange(ctx, q, srv)
	if err == nil && r.Truncated {
		r, _, err = c.tcp.ExchangeContext(ctx, q, srv)
	}
	rtt := time.Since(start)
	if err != nil {
		return nil, rtt, err
	}
	if err := answers(q, r); err != nil {
		return nil, rtt, err
	}
	return r, rtt, nil
}

// udpExchange sends q over a fresh connected UDP socket (a random source
// port per query, so an off-path spoofer must guess port and ID) and
// retransmits the same datagram on it after c.retry, doubling the wait each
// time up to maxRetryWait, until an answer arrives or ctx ends: a lost query or answer costs a
// retry interval, not the whole timeout. An answer to any of the sends is
// accepted. The answer is read into a full-size buffer, so a server that
// answers above the size we advertised is read whole, not cut short.
// Datagrams with another ID or question are ignored, as stale or spoofed
// answers may arrive.
func (c *Client) udpExchange(ctx context.Context, q *dns.Msg, srv string) (*dns.Msg, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", srv)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	b, err := q.Pack()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, dns.MaxMsgSize)
	wait := c.retry
	for {
		if _, err := conn.Write(b); err != nil {
			return nil, err
		}
		resend := time.Now().Add(wait)
		if dl, ok := ctx.Deadline(); ok && dl.Before(resend) {
			resend = dl
		}
		conn.SetReadDeadline(resend)
		r, err := readAnswer(conn, buf, q)
		if err == nil {
			return r, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return nil, err
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// readAnswer reads datagrams until one answers q (same ID and question) or
// the read deadline passes. A datagram that does not parse or answers
// another question is skipped, never taken as the answer.
func readAnswer(conn net.Conn, buf []byte, q *dns.Msg) (*dns.Msg, error) {
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		if n < 12 || buf[0] != byte(q.Id>>8) || buf[1] != byte(q.Id) {
			continue
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			continue
		}
		if answers(q, r) != nil {
			continue
		}
		return r, nil
	}
}

// answers rejects a message that is not a response to q: a query (an
// echo of q, or a query sent to the socket, has no QR bit), another opcode,
// or an answer to another question. miekg/dns checks the ID only, and a
// response for another name must never be used for this one.
func answers(q, r *dns.Msg) error {
	if !r.Response || r.Opcode != q.Opcode {
		return fmt.Errorf("message with QR=%v opcode %s is not a response to the query", r.Response, dns.OpcodeToString[r.Opcode])
	}
	if len(r.Question) != 1 {
		return fmt.Errorf("answer has %d questions", len(r.Question))
	}
	a, b := q.Question[0], r.Question[0]
	if a.Qtype != b.Qtype || a.Qclass != b.Qclass || !strings.EqualFold(a.Name, b.Name) {
		return fmt.Errorf("answer is for %s %s, asked %s %s", b.Name, dns.TypeToString[b.Qtype], a.Name, dns.TypeToString[a.Qtype])
	}
	return nil
}

// Exchanger sends one query and returns the answer; *Client and the
// daemon's caching resolver implement it.
type Exchanger interface {
	Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, time.Duration, error)
}

// LookupNetIP resolves host to its IPv4 and IPv6 addresses (A and AAAA asked
// in parallel), following CNAME chains inside the answers. The addresses are
// not filtered: callers classify them. An IP literal is returned as is. A
// name with no address is a *net.DNSError with IsNotFound set; a name whose
// answer is an alias of a local name (LocalAlias) is an *AliasError.
func (c *Client) LookupNetIP(ctx context.Context, host string) ([]netip.Addr, error) {
	return LookupNetIP(ctx, c, host, c.udpSize)
}

// LookupNetIP is Client.LookupNetIP through any Exchanger, advertising
// udpSize in EDNS0. A lost answer (a timeout) is a temporary error, never
// "no such host".
func LookupNetIP(ctx context.Context, ex Exchanger, host string, udpSize uint16) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return []netip.Addr{a}, nil
	}
	name := dns.Fqdn(host)
	if _, ok := dns.IsDomainName(name); !ok {
		return nil, &net.DNSError{Err: "invalid host name", Name: host}
	}
	if udpSize == 0 {
		udpSize = DefaultUDPSize
	}
	type result struct {
		addrs []netip.Addr
		err   error
	}
	ch := make(chan result, 2)
	for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
		go func() {
			a, err := lookupType(ctx, ex, name, t, udpSize)
			ch <- result{a, err}
		}()
	}
	var addrs []netip.Addr
	var errs []error
	var alias *AliasError
	for range 2 {
		r := <-ch
		addrs = append(addrs, r.addrs...)
		if r.err != nil {
			errs = append(errs, r.err)
			errors.As(r.err, &alias)
		}
	}
	if alias != nil {
		// One family aliased to a local name taints the other's answer.
		return nil, alias
	}
	if len(addrs) > 0 {
		return addrs, nil
	}
	var notFound *net.DNSError
	for _, e := range errs {
		if errors.As(e, &notFound) && notFound.IsNotFound {
			continue
		}
		return nil, &net.DNSError{Err: e.Error(), Name: host, IsTemporary: true}
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func lookupType(ctx context.Context, ex Exchanger, name string, t, udpSize uint16) ([]netip.Addr, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, t)
	m.SetEdns0(udpSize, false)
	r, _, err := ex.Exchange(ctx, m)
	if err != nil {
		return nil, err
	}
	switch r.Rcode {
	case dns.RcodeSuccess:
	case dns.RcodeNameError:
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	default:
		return nil, fmt.Errorf("resolving %s %s: upstream answered %s", name, dns.TypeToString[t], dns.RcodeToString[r.Rcode])
	}
	// The proxy resolves only A and AAAA: an alias into the reverse name of
	// one of the host's own public addresses tells it nothing, and the
	// address classes alone suffice here.
	if a := LocalAlias(name, r.Answer, nil); a != "" {
		return nil, &AliasError{Name: name, Alias: a}
	}
	return ChainAddrs(name, t, r.Answer), nil
}

// ChainAddrs returns the addresses of type t (A or AAAA) that answer name:
// those owned by name or by a name reached from it through the CNAME records
// of answer. Records for unrelated owners are ignored.
func ChainAddrs(name string, t uint16, answer []dns.RR) []netip.Addr {
	chain := CNAMEChain(name, answer)
	var out []netip.Addr
	for _, rr := range answer {
		if rr.Header().Rrtype != t || !chain[strings.ToLower(rr.Header().Name)] {
			continue
		}
		var ip net.IP
		switch v := rr.(type) {
		case *dns.A:
			ip = v.A
		case *dns.AAAA:
			ip = v.AAAA
		}
		if a, ok := netip.AddrFromSlice(ip); ok {
			if t == dns.TypeA {
				a = a.Unmap()
			}
			out = append(out, a)
		}
	}
	return out
}

// CNAMEChain returns the set of lowercase FQDNs reachable from name through
// CNAME records in rrs, name included, following at most 16 aliases.
func CNAMEChain(name string, rrs []dns.RR) map[string]bool {
	chain := map[string]bool{}
	walkChain(name, rrs, func(n string) bool {
		chain[n] = true
		return true
	})
	return chain
}

// walkChain calls f with name and then each alias the CNAME records of rrs
// lead to (lowercase FQDNs, at most 16 aliases, no name twice) until f
// returns false.
func walkChain(name string, rrs []dns.RR, f func(string) bool) {
	cur := strings.ToLower(dns.Fqdn(name))
	seen := map[string]bool{cur: true}
	if !f(cur) {
		return
	}
	for range maxCNAMEChain {
		next := ""
		for _, rr := range rrs {
			if cn, ok := rr.(*dns.CNAME); ok && strings.EqualFold(cn.Hdr.Name, cur) {
				next = strings.ToLower(cn.Target)
				break
			}
		}
		if next == "" || seen[next] {
			return
		}
		seen[next] = true
		if !f(next) {
			return
		}
		cur = next
	}
}

// LocalAlias returns the first alias on the CNAME chain from name in rrs
// that is a local name (allowlist.LocalName: single-label, special-use,
// numeric) or a reverse-mapping name that is not a complete public address
// (5.0.0.10.in-addr.arpa, 168.192.in-addr.arpa: netclass.ReversePublic
// with p, which may be nil: then the host's own addresses are not known),
// or "". The queried name itself was decided by the filter; its aliases
// were followed by the upstream, which may have answered them from the
// host's own network (a LAN's reverse zone names its hosts).
func LocalAlias(name string, rrs []dns.RR, p *netclass.Policy) string {
	first, alias := true, ""
	walkChain(name, rrs, func(n string) bool {
		if first {
			first = false
			return true
		}
		if allowlist.LocalName(n) || privateReverse(n, p) {
			alias = n
			return false
		}
		return true
	})
	return alias
}

// privateReverse reports whether n is a reverse-mapping name the filters
// never ask about (netclass.ReversePublic).
func privateReverse(n string, p *netclass.Policy) bool {
	n = strings.ToLower(strings.TrimSuffix(n, "."))
	return netclass.IsReverseName(n) && !netclass.ReversePublic(n, p)
}

// AliasError is a lookup whose answer is an alias of a local name
// (LocalAlias): refused, never "no such host".
type AliasError struct {
	Name, Alias string
}

func (e *AliasError) Error() string {
	return fmt.Sprintf("%s is an alias of %s, a local or special-use name", strings.TrimSuffix(e.Name, "."), strings.TrimSuffix(e.Alias, "."))
}
