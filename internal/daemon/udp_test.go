package daemon

import (
	"net"
	"testing"
)

// A socket bound to one address is served without per-datagram control
// messages; a wildcard socket keeps them, so each answer leaves from the
// address its query was sent to.
func TestPlainUDPOnlyForBoundSockets(t *testing.T) {
	for _, tt := range []struct {
		addr  string
		plain bool
	}{
		{"127.0.0.1:0", true},
		{"0.0.0.0:0", false},
		{"[::]:0", false},
	} {
		pc, err := net.ListenPacket("udp", tt.addr)
		if err != nil {
			t.Skipf("%s: %v", tt.addr, err)
		}
		_, isUDP := plainUDP(pc).(*net.UDPConn)
		if isUDP == tt.plain {
			t.Errorf("%s: served as *net.UDPConn = %v, want %v", tt.addr, isUDP, !tt.plain)
		}
		pc.Close()
	}
}
