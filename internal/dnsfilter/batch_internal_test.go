package dnsfilter

import (
	"net"
	"testing"
)

// A socket bound to one address is served in batches; a wildcard socket
// is left to miekg/dns, which answers each datagram from the address it
// was sent to.
func TestBatchedOnlyForBoundSockets(t *testing.T) {
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
		if _, _, ok := batchable(pc); ok != tt.batched {
			t.Errorf("%s: batched = %v, want %v", tt.addr, ok, tt.batched)
		}
		pc.Close()
	}
}
