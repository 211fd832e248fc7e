package dnsfilter

import (
	"net"
	"runtime"
	"testing"
)

// A socket bound to one address is served in batches; a wildcard socket
// is left to miekg/dns, which answers each datagram from the address it
// was sent to. On Linux a batched socket is taken out of Go's poller.
func TestBatchedOnlyForBoundSockets(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	for _, tt := range []struct {
		addr    string
		batched bool
	}{
		{"127.0.0.1:0", true},
		{"[::1]:0", true},
		{"0.0.0.0:0", false},
		{"[::]:0", false},
	} {
		pc, err := net.ListenPacket("udp", tt.addr)
		if err != nil {
			t.Logf("%s: %v", tt.addr, err)
			continue
		}
		u, ok := batchable(pc)
		if ok != tt.batched {
			t.Errorf("%s: batched = %v, want %v", tt.addr, ok, tt.batched)
		}
		if ok && u.poller && runtime.GOOS == "linux" {
			t.Errorf("%s: served through Go's poller, want a detached blocking socket", tt.addr)
		}
		if ok {
			u.close()
		} else {
			pc.Close()
		}
	}
}

// With one P the socket stays in Go's poller: a reader blocked in a
// receive would hold the only P.
func TestPollerWithOneP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, ok := batchable(pc)
	if !ok || !u.poller {
		t.Errorf("GOMAXPROCS=1: batched %v, through the poller %v; want both", ok, ok && u.poller)
	}
	if ok {
		u.close()
	} else {
		pc.Close()
	}
}
