//go:build !linux

package httpfilter

import "net"

// tuneGuestConn keeps the platform's defaults (see sockopt_linux.go).
func tuneGuestConn(net.Conn) {}
