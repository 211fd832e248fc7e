package httpfilter

import (
	"errors"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// originalDst is the destination a DNATed connection had before the host
// rewrote it (SO_ORIGINAL_DST, read from conntrack). The kernel fills a
// struct sockaddr_in; GetsockoptIPv6Mreq is the x/sys call whose buffer
// holds one (16 bytes: family, port, address, padding).
func originalDst(c net.Conn) (netip.AddrPort, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return netip.AddrPort{}, errors.New("original destination: not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var (
		ap   netip.AddrPort
		serr error
	)
	err = raw.Control(func(fd uintptr) {
		m, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		a := m.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{a[4], a[5], a[6], a[7]}), uint16(a[2])<<8|uint16(a[3]))
	})
	if err == nil {
		err = serr
	}
	return ap, err
}
