package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/abox-dev/abox/internal/netclass"
)

type seqResolver struct {
	mu      sync.Mutex
	answers [][]netip.Addr
	calls   int
}

func (r *seqResolver) LookupNetIP(_ context.Context, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if len(r.answers) == 0 {
		return nil, errors.New("nxdomain")
	}
	return r.answers[min(r.calls-1, len(r.answers)-1)], nil
}

type fakeDialer struct{ addrs []string }

func (d *fakeDialer) DialContext(_ context.Context, _, addr string) (net.Conn, error) {
	d.addrs = append(d.addrs, addr)
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestGuardCheck(t *testing.T) {
	pol := netclass.NewPolicy([]netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}, addrs("203.0.114.7"))
	tests := []struct {
		name       string
		answer     []netip.Addr
		literal    string
		wantReason string
		wantAddrs  int
	}{
		{name: "public name", answer: addrs("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"), wantAddrs: 2},
		{name: "private name", answer: addrs("10.0.0.1"), wantReason: "private"},
		{name: "mixed public and loopback is refused whole", answer: addrs("93.184.215.14", "127.0.0.1"), wantReason: "loopback"},
		{name: "mapped loopback", answer: addrs("::ffff:127.0.0.1"), wantReason: "loopback"},
		{name: "nat64 metadata", answer: addrs("64:ff9b::a9fe:a9fe"), wantReason: "metadata"},
		{name: "azure wireserver, public yet metadata", answer: addrs("168.63.129.16"), wantReason: "metadata"},
		{name: "host address", answer: addrs("203.0.114.7"), wantReason: "host_address"},
		{name: "permitted range", answer: addrs("10.9.1.1"), wantAddrs: 1},
		{name: "no answer", answer: []netip.Addr{}, wantReason: ReasonNoAddress},
		{name: "resolver error", wantReason: ReasonResolveFailed},
		{name: "private literal", literal: "192.168.1.1", wantReason: "private"},
		{name: "public literal", literal: "1.1.1.1", wantAddrs: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &seqResolver{}
			if tt.answer != nil {
				r.answers = [][]netip.Addr{tt.answer}
			}
			g := &Guard{Resolver: r, Policy: pol}
			tgt := Target{Name: "x.example", Port: 443}
			if tt.literal != "" {
				tgt = Target{Addr: netip.MustParseAddr(tt.literal), Port: 443}
			}
			c, ref := g.Check(context.Background(), tgt)
			gotReason := ""
			if ref != nil {
				gotReason = ref.Reason
			}
			if gotReason != tt.wantReason {
				t.Fatalf("reason = %q, want %q", gotReason, tt.wantReason)
			}
			if tt.wantAddrs > 0 && len(c.Addrs) != tt.wantAddrs {
				t.Errorf("checked %d addresses, want %d", len(c.Addrs), tt.wantAddrs)
			}
			wantCalls := 1
			if tt.literal != "" {
				wantCalls = 0
			}
			if r.calls != wantCalls {
				t.Errorf("resolver called %d times, want %d", r.calls, wantCalls)
			}
		})
	}
}

// TestGuardRebinding: the name answers public, then private. Check resolves
// once and Dial goes to the checked address without a second lookup.
func TestGuardRebinding(t *testing.T) {
	r := &seqResolver{answers: [][]netip.Addr{addrs("93.184.215.14"), addrs("127.0.0.1")}}
	d := &fakeDialer{}
	g := &Guard{Resolver: r, Policy: netclass.NewPolicy(nil, nil), Dialer: d}
	c, ref := g.Check(context.Background(), Target{Name: "rebind.example", Port: 443})
	if ref != nil {
		t.Fatalf("Check refused: %v", ref)
	}
	conn, err := g.Dial(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if r.calls != 1 {
		t.Errorf("resolver called %d times, want 1", r.calls)
	}
	if len(d.addrs) != 1 || d.addrs[0] != "93.184.215.14:443" {
		t.Errorf("dialled %v, want [93.184.215.14:443]", d.addrs)
	}
}

func TestGuardDialNothingUnchecked(t *testing.T) {
	g := &Guard{Dialer: &fakeDialer{}}
	if _, err := g.Dial(context.Background(), nil); err == nil {
		t.Fatal("Dial(nil) succeeded")
	}
	if _, err := g.Dial(context.Background(), &Checked{Target: Target{Name: "x", Port: 1}}); err == nil {
		t.Fatal("Dial with no addresses succeeded")
	}
}

// TestGuardRecheck: addresses checked earlier are classified again by the
// policy in force, with no lookup; one it now refuses refuses the target.
func TestGuardRecheck(t *testing.T) {
	res := &seqResolver{answers: [][]netip.Addr{addrs("10.0.0.5")}}
	open := &Guard{Resolver: res, Policy: netclass.New(netclass.Options{PermitHost: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})}
	tgt, err := ParseAuthority("name.test:443", 0)
	if err != nil {
		t.Fatal(err)
	}
	c, ref := open.Check(context.Background(), tgt)
	if ref != nil {
		t.Fatalf("check: %v", ref)
	}
	if got, ref := open.Recheck(c); ref != nil || got != c {
		t.Errorf("recheck under the same policy: %v %v", got, ref)
	}
	closed := &Guard{Resolver: res, Policy: netclass.New(netclass.Options{})}
	if _, ref := closed.Recheck(c); ref == nil || ref.Class != netclass.Private {
		t.Errorf("recheck under a policy without the range: %v, want refused as private", ref)
	}
	if res.calls != 1 {
		t.Errorf("%d lookups, want the one of Check", res.calls)
	}
}
