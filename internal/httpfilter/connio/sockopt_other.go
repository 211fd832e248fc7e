//go:build !linux

package connio

import "net"

// TuneGuestConn keeps the platform's defaults (see sockopt_linux.go).
func TuneGuestConn(net.Conn) {}
