package connio

import (
	"net"

	"golang.org/x/sys/unix"
)

// GuestCongestion is the congestion control of the guest's connections to
// the proxy. The link to the guest is host-local: nothing is lost on it but
// what arrives out of order, and a control that paces (BBR, often the host's
// default) or backs off on that reordering (CUBIC's HyStart and spurious
// losses) keeps the proxy's window small. The proxy's bytes then leave when
// the guest's acknowledgements open it, in the receiving side's own system
// calls and timers, on the guest's CPU instead of the proxy's. Reno grows
// its window until the guest's receive window is the limit, so a download's
// bytes are sent by the proxy's writes; every kernel has it and any process
// may choose it.
const GuestCongestion = "reno"

// TuneGuestConn sets the guest connection's socket options. It is best
// effort: a connection that is not TCP, or a kernel that refuses, keeps its
// defaults.
func TuneGuestConn(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, GuestCongestion)
	})
}
