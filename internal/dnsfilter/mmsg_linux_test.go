package dnsfilter

import (
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestSockaddrPort: a sender's address as recvmmsg writes it (the family in
// host order, the port in network order) reads as that address and port;
// anything short or of another family reads as no address, which the
// reader skips.
func TestSockaddrPort(t *testing.T) {
	v4 := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: [4]byte{10, 10, 10, 2}}
	*(*[2]byte)(unsafe.Pointer(&v4.Port)) = [2]byte{0xd4, 0x31} // 54321
	v6 := unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: netip.MustParseAddr("2001:db8::53").As16(), Scope_id: 3}
	*(*[2]byte)(unsafe.Pointer(&v6.Port)) = [2]byte{0x00, 0x35} // 53
	bytesOf := func(p unsafe.Pointer, n int) []byte { return unsafe.Slice((*byte)(p), n) }
	for _, tt := range []struct {
		name string
		sa   []byte
		want netip.AddrPort
	}{
		{"inet", bytesOf(unsafe.Pointer(&v4), unix.SizeofSockaddrInet4), netip.MustParseAddrPort("10.10.10.2:54321")},
		{"inet6", bytesOf(unsafe.Pointer(&v6), unix.SizeofSockaddrInet6), netip.MustParseAddrPort("[2001:db8::53]:53")},
		{"inet cut", bytesOf(unsafe.Pointer(&v4), 6), netip.AddrPort{}},
		{"inet6 cut", bytesOf(unsafe.Pointer(&v6), unix.SizeofSockaddrInet4), netip.AddrPort{}},
		{"unix", []byte{byte(unix.AF_UNIX), 0, '/', 't', 'm', 'p', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, netip.AddrPort{}},
		{"empty", nil, netip.AddrPort{}},
	} {
		if got := sockaddrPort(tt.sa); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
}
