//go:build !linux

package dnsfilter

import (
	"errors"
	"net"
)

// recvFlags are the flags of a batch read.
const recvFlags = 0

// detached exists on Linux only (see udpfd_linux.go); elsewhere every
// socket is served through Go's poller.
func detached(*net.UDPConn) (*udpSocket, error) {
	return nil, errors.ErrUnsupported
}
