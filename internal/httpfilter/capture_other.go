//go:build !linux

package httpfilter

import (
	"errors"
	"net"
	"net/netip"
)

// originalDst needs conntrack's SO_ORIGINAL_DST, which only Linux has.
func originalDst(net.Conn) (netip.AddrPort, error) {
	return netip.AddrPort{}, errors.New("original destination: only known on Linux")
}
