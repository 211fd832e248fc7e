package dnsfilter

import (
	"encoding/binary"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsgBatch is one reader's batch on a detached socket, read with recvmmsg
// and answered with sendmmsg. The headers of both calls, their buffers
// (the slots') and the storage of the senders' addresses are laid out once;
// a read only resets the address lengths the kernel wrote, and an answer
// points its header at its query's sender address as the kernel wrote it.
type mmsgBatch struct {
	c     *blockingConn
	slots []udpSlot
	in    []unix.Mmsghdr
	inIov []unix.Iovec
	// names are the senders' addresses, one per slot, in the kernel's
	// sockaddr_in or sockaddr_in6 form.
	names  [][unix.SizeofSockaddrInet6]byte
	out    []unix.Mmsghdr
	outIov []unix.Iovec
	last   int // datagrams of the last read
	nout   int // answers queued
}

func newMmsgBatch(c *blockingConn, slots []udpSlot) *mmsgBatch {
	n := len(slots)
	b := &mmsgBatch{
		c: c, slots: slots,
		in: make([]unix.Mmsghdr, n), inIov: make([]unix.Iovec, n),
		names: make([][unix.SizeofSockaddrInet6]byte, n),
		out:   make([]unix.Mmsghdr, n), outIov: make([]unix.Iovec, n),
		last: n,
	}
	for i := range slots {
		b.inIov[i].Base = &slots[i].in[0]
		b.inIov[i].SetLen(len(slots[i].in))
		h := &b.in[i].Hdr
		h.Name = &b.names[i][0]
		h.Iov = &b.inIov[i]
		h.SetIovlen(1)
	}
	return b
}

func (b *mmsgBatch) read() (int, error) {
	b.nout = 0
	for i := range b.last {
		b.in[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.in[i].Hdr.Flags = 0
	}
	n, err := b.c.mmsg("recvmmsg", unix.SYS_RECVMMSG, b.in, recvFlags)
	b.last = max(n, 0)
	for i := range b.last {
		h, sl := &b.in[i], &b.slots[i]
		sl.n, sl.cut = int(h.Len), h.Hdr.Flags&unix.MSG_TRUNC != 0
		sl.from = sockaddrPort(b.names[i][:min(h.Hdr.Namelen, unix.SizeofSockaddrInet6)])
	}
	return n, err
}

func (b *mmsgBatch) answer(i int, p []byte) {
	k := b.nout
	b.outIov[k].Base = &p[0]
	b.outIov[k].SetLen(len(p))
	h := &b.out[k].Hdr
	h.Name, h.Namelen = &b.names[i][0], b.in[i].Hdr.Namelen
	h.Iov = &b.outIov[k]
	h.SetIovlen(1)
	b.nout++
}

func (b *mmsgBatch) queued() int { return b.nout }

func (b *mmsgBatch) write(k int) (int, error) {
	return b.c.mmsg("sendmmsg", unix.SYS_SENDMMSG, b.out[k:b.nout], 0)
}

// mmsg runs recvmmsg or sendmmsg (trap) over hs, waiting as use does.
func (c *blockingConn) mmsg(name string, trap uintptr, hs []unix.Mmsghdr, flags int) (int, error) {
	var n uintptr
	var errno syscall.Errno
	if err := c.use(func(fd uintptr) bool {
		n, _, errno = unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(&hs[0])), uintptr(len(hs)), uintptr(flags), 0, 0)
		return errno != unix.EAGAIN && errno != unix.EINTR
	}); err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, os.NewSyscallError(name, errno)
	}
	return int(n), nil
}

// sockaddrPort reads a sockaddr_in or sockaddr_in6 as the kernel wrote it
// (the family in host order, the port in network order); anything else is
// the zero AddrPort.
func sockaddrPort(sa []byte) netip.AddrPort {
	if len(sa) < 2 {
		return netip.AddrPort{}
	}
	switch binary.NativeEndian.Uint16(sa) {
	case unix.AF_INET:
		if len(sa) >= unix.SizeofSockaddrInet4 {
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:]))
		}
	case unix.AF_INET6:
		if len(sa) >= unix.SizeofSockaddrInet6 {
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa[8:24])), binary.BigEndian.Uint16(sa[2:]))
		}
	}
	return netip.AddrPort{}
}
