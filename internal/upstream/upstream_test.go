package upstream_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

func newClient(t *testing.T, timeout time.Duration, servers ...string) *upstream.Client {
	t.Helper()
	c, err := upstream.New(upstream.Config{Servers: servers, Timeout: timeout})
	if err != nil {
		t.Fatalf("upstream.New: %v", err)
	}
	return c
}

// deadServer returns a loopback UDP address that reads nothing and answers nothing.
func deadServer(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}

func TestParseServer(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "1.1.1.1", want: "1.1.1.1:53"},
		{in: "1.1.1.1:5353", want: "1.1.1.1:5353"},
		{in: "::1", want: "[::1]:53"},
		{in: "[::1]:54", want: "[::1]:54"},
		{in: "dns.google", wantErr: true},
		{in: "1.1.1.1:0", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := upstream.ParseServer(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseServer(%q) error = %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("ParseServer(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestExchange(t *testing.T) {
	ctx := context.Background()
	t.Run("answers", func(t *testing.T) {
		f := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14")
		c := newClient(t, time.Second, f.Addr)
		m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
		r, _, err := c.Exchange(ctx, m)
		if err != nil {
			t.Fatalf("Exchange: %v", err)
		}
		if len(r.Answer) != 1 {
			t.Fatalf("got %d answers, want 1", len(r.Answer))
		}
	})
	t.Run("failover when first is dead", func(t *testing.T) {
		f := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14")
		// The timeout is also the live server's time to answer: wide enough for a loaded machine.
		c := newClient(t, time.Second, deadServer(t), f.Addr)
		r, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA))
		if err != nil {
			t.Fatalf("Exchange: %v", err)
		}
		if len(r.Answer) != 1 || f.Count() != 1 {
			t.Fatalf("got %d answers and %d upstream queries, want 1 and 1", len(r.Answer), f.Count())
		}
	})
	t.Run("failover on SERVFAIL", func(t *testing.T) {
		bad := fakedns.StartT(t).SetRcode("example.com", dns.RcodeServerFailure)
		good := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14")
		c := newClient(t, time.Second, bad.Addr, good.Addr)
		r, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA))
		if err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("Exchange = %v, %v; want success from the second server", r, err)
		}
	})
	t.Run("all dead is an error", func(t *testing.T) {
		c := newClient(t, 100*time.Millisecond, deadServer(t), deadServer(t))
		if _, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA)); err == nil {
			t.Fatal("Exchange succeeded with only dead servers")
		}
	})
	t.Run("truncated UDP retried over TCP", func(t *testing.T) {
		f := fakedns.StartT(t).Add("example.com. 60 IN A 93.184.215.14").SetTruncate(true)
		c := newClient(t, time.Second, f.Addr)
		r, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA))
		if err != nil {
			t.Fatalf("Exchange: %v", err)
		}
		var nets []string
		for _, q := range f.Queries() {
			nets = append(nets, q.Net)
		}
		if r.Truncated || len(r.Answer) != 1 || !slices.Equal(nets, []string{"udp", "tcp"}) {
			t.Fatalf("got TC=%v answers=%d transports=%v, want full answer via udp then tcp", r.Truncated, len(r.Answer), nets)
		}
	})
	t.Run("answer above the advertised size retried over TCP", func(t *testing.T) {
		f := fakedns.StartT(t).Handle("big.example.com", func(req *dns.Msg) *dns.Msg {
			m := new(dns.Msg).SetReply(req)
			for i := range 100 {
				rr, _ := dns.NewRR(fmt.Sprintf("big.example.com. 60 IN A 93.184.1.%d", i+1))
				m.Answer = append(m.Answer, rr)
			}
			return m
		})
		c := newClient(t, time.Second, f.Addr)
		m := new(dns.Msg).SetQuestion("big.example.com.", dns.TypeA)
		m.SetEdns0(1232, false)
		r, _, err := c.Exchange(ctx, m)
		if err != nil {
			t.Fatalf("Exchange: %v", err)
		}
		if len(r.Answer) != 100 {
			t.Fatalf("got %d answers, want 100 (over TCP)", len(r.Answer))
		}
	})
	t.Run("a message without the QR bit is not an answer", func(t *testing.T) {
		// An echo of the query with an address added: before, it was
		// taken as the answer (and cached by the filters).
		f := fakedns.StartT(t).Handle("example.com", func(req *dns.Msg) *dns.Msg {
			m := req.Copy()
			rr, _ := dns.NewRR("example.com. 60 IN A 10.0.0.1")
			m.Answer = []dns.RR{rr}
			return m
		})
		c := newClient(t, 300*time.Millisecond, f.Addr)
		if r, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA)); err == nil {
			t.Fatalf("Exchange accepted a query as its answer: %v", r)
		}
	})
	t.Run("answer to another question is refused", func(t *testing.T) {
		f := fakedns.StartT(t).Handle("example.com", func(req *dns.Msg) *dns.Msg {
			m := new(dns.Msg).SetQuestion("evil.test.", dns.TypeA)
			m.Id, m.Response = req.Id, true
			rr, _ := dns.NewRR("evil.test. 60 IN A 10.0.0.1")
			m.Answer = []dns.RR{rr}
			return m
		})
		c := newClient(t, time.Second, f.Addr)
		if r, _, err := c.Exchange(ctx, new(dns.Msg).SetQuestion("example.com.", dns.TypeA)); err == nil {
			t.Fatalf("Exchange accepted an answer for another name: %v", r)
		}
	})
}

func TestLookupNetIP(t *testing.T) {
	ctx := context.Background()
	f := fakedns.StartT(t).Add(
		"example.com. 60 IN A 93.184.215.14",
		"example.com. 60 IN AAAA 2606:2800:21f:cb07:6820:80da:af6b:8b2c",
		"www.example.com. 60 IN CNAME cdn.example.net.",
		"cdn.example.net. 60 IN CNAME edge.example.org.",
		"edge.example.org. 60 IN A 198.51.100.7",
		"v6only.example.com. 60 IN AAAA 2001:4860::1",
	)
	c := newClient(t, time.Second, f.Addr)
	tests := []struct {
		host     string
		want     []string
		notFound bool
	}{
		{host: "example.com", want: []string{"93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"}},
		{host: "www.example.com", want: []string{"198.51.100.7"}},
		{host: "v6only.example.com", want: []string{"2001:4860::1"}},
		{host: "10.1.2.3", want: []string{"10.1.2.3"}},
		{host: "missing.example.com", notFound: true},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			got, err := c.LookupNetIP(ctx, tt.host)
			if tt.notFound {
				var de *net.DNSError
				if !errors.As(err, &de) || !de.IsNotFound {
					t.Fatalf("LookupNetIP(%q) = %v, %v; want not-found DNSError", tt.host, got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("LookupNetIP(%q): %v", tt.host, err)
			}
			var want []netip.Addr
			for _, s := range tt.want {
				want = append(want, netip.MustParseAddr(s))
			}
			slices.SortFunc(got, netip.Addr.Compare)
			slices.SortFunc(want, netip.Addr.Compare)
			if !slices.Equal(got, want) {
				t.Errorf("LookupNetIP(%q) = %v, want %v", tt.host, got, want)
			}
		})
	}
}

func TestChainAddrsIgnoresOtherOwners(t *testing.T) {
	var rrs []dns.RR
	for _, s := range []string{
		"a.example.com. 60 IN CNAME b.example.com.",
		"b.example.com. 60 IN A 93.184.215.14",
		"unrelated.test. 60 IN A 10.0.0.1",
	} {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		rrs = append(rrs, rr)
	}
	got := upstream.ChainAddrs("A.example.com", dns.TypeA, rrs)
	want := []netip.Addr{netip.MustParseAddr("93.184.215.14")}
	if !slices.Equal(got, want) {
		t.Errorf("ChainAddrs = %v, want %v", got, want)
	}
}

// A resolver that drops a share of datagrams (as the lab's does under
// load) costs retries, never a failed lookup and never "no such host":
// every lost query is sent again well inside the timeout.
func TestLossyUpstreamIsRetransmitted(t *testing.T) {
	f := fakedns.StartT(t).SetLoss(0.3)
	const names = 100
	for i := range names {
		f.Add(fmt.Sprintf("n%d.example.com. 60 IN A 93.184.215.%d", i, i+1))
	}
	// A 5 s timeout means ten sends: losing all of them is a 1 in 10^5
	// event, while sending once fails about 30 lookups.
	c := newClient(t, 5*time.Second, f.Addr)
	errs := make(chan error, names)
	sem := make(chan struct{}, 16)
	for i := range names {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			host := fmt.Sprintf("n%d.example.com", i)
			addrs, err := c.LookupNetIP(context.Background(), host)
			if err == nil && len(addrs) != 1 {
				err = fmt.Errorf("%s: got %v, want one address", host, addrs)
			}
			errs <- err
		}()
	}
	failed := 0
	for range names {
		if err := <-errs; err != nil {
			failed++
			t.Error(err)
		}
	}
	// Two queries (A and AAAA) per name; with 30% loss, about 40% more
	// were needed.
	if got := f.Count(); got <= 2*names {
		t.Errorf("upstream saw %d queries for %d names: no retransmission happened", got, names)
	}
	if failed > 0 {
		t.Errorf("%d of %d lookups failed through a lossy upstream", failed, names)
	}
}
