package dnsfilter

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A UDP socket served outside Go's network poller. Registered with the
// poller, the socket is in the runtime's epoll set for reading and
// writing: every datagram sent, once the kernel frees it, runs an epoll
// callback, and an empty socket parks the reader and wakes it through the
// poller. Served here, the socket is a duplicate of its descriptor in
// blocking mode, out of the epoll set (the original is closed, which takes
// it out): a reader sleeps in recvmmsg itself (MSG_WAITFORONE: the call
// returns as soon as one datagram is in, with whatever else is queued).
//
// Each reader reads and writes its batches with recvmmsg and sendmmsg
// directly (mmsgBatch): the message headers, their buffers and the
// senders' addresses are laid out once, an answer goes back to the
// address its query came from as the kernel wrote it, and no datagram
// costs an allocation. A receive timeout (blockingPoll) bounds each wait,
// so that a reader sees a stop within that time; the descriptor is closed
// only once no call uses it, so a late answer can never go out on another
// socket that reused its number.

// blockingPoll is the longest a reader waits in one receive before it
// looks whether the socket was stopped.
const blockingPoll = 100 * time.Millisecond

// recvFlags are the flags of a batch read: wait for the first datagram,
// not for a full batch.
const recvFlags = unix.MSG_WAITFORONE

// blockingConn is a bound UDP socket in blocking mode, read and written
// through mmsgBatch and writeTo. Close stops it.
type blockingConn struct {
	fd int
	v4 bool // the socket's family is AF_INET
	// mu is held shared by every call on fd and exclusively by Close,
	// which sets closed first: calls waiting in a receive see it within
	// blockingPoll.
	mu     sync.RWMutex
	closed atomic.Bool
	once   sync.Once // closes fd
}

// detach takes c's socket out of Go's poller: it returns a blocking
// duplicate of it and closes c. On error c is left as it was.
func detach(c *net.UDPConn) (*blockingConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, family := -1, 0
	var derr error
	if err := rc.Control(func(s uintptr) {
		if fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0); derr != nil {
			return
		}
		family, derr = unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, os.NewSyscallError("dup", derr)
	}
	// From here on the socket is ours alone: c's close removes it from
	// the poller, and only then does it turn blocking (the flag belongs
	// to the open file, which the duplicate shares).
	c.Close()
	tv := unix.NsecToTimeval(blockingPoll.Nanoseconds())
	for _, err := range []error{
		unix.SetNonblock(fd, false),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv),
	} {
		if err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("setsockopt", err)
		}
	}
	return &blockingConn{fd: fd, v4: family == unix.AF_INET}, nil
}

// detached is c served as a blockingConn.
func detached(c *net.UDPConn) (*udpSocket, error) {
	bc, err := detach(c)
	if err != nil {
		return nil, err
	}
	return &udpSocket{
		batch: func(slots []udpSlot) udpBatch { return newMmsgBatch(bc, slots) },
		send:  bc.writeTo,
		stop:  bc.stop,
		close: func() { bc.Close() },
	}, nil
}

// use runs f on the descriptor until it reports done, unless the socket
// is or gets closed.
func (c *blockingConn) use(f func(fd uintptr) bool) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for {
		if c.closed.Load() {
			return net.ErrClosed
		}
		if f(uintptr(c.fd)) {
			return nil
		}
	}
}

// stop makes every call return net.ErrClosed within blockingPoll, without
// waiting for them.
func (c *blockingConn) stop() { c.closed.Store(true) }

// Close stops the socket, waits for the calls in progress and closes the
// descriptor.
func (c *blockingConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.closed.Store(true)
		c.mu.Lock()
		defer c.mu.Unlock()
		err = unix.Close(c.fd)
	})
	return err
}

// done reports whether a call on the socket that returned err is over:
// not when it timed out (EAGAIN: see whether the socket was stopped, then
// wait again) or was interrupted by a signal (EINTR: with a timeout set,
// the kernel does not restart it).
func done(err error) bool { return err != unix.EAGAIN && err != unix.EINTR }

// sockaddr is to as the socket's family addresses it.
func (c *blockingConn) sockaddr(to netip.AddrPort) (unix.Sockaddr, error) {
	a := to.Addr()
	if c.v4 {
		if a = a.Unmap(); !a.Is4() {
			return nil, &net.AddrError{Err: "not an IPv4 address", Addr: a.String()}
		}
		return &unix.SockaddrInet4{Port: int(to.Port()), Addr: a.As4()}, nil
	}
	return &unix.SockaddrInet6{Port: int(to.Port()), Addr: a.As16()}, nil
}

// writeTo sends b to one client.
func (c *blockingConn) writeTo(b []byte, to netip.AddrPort) error {
	sa, err := c.sockaddr(to)
	if err != nil {
		return err
	}
	var serr error
	if err := c.use(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, sa)
		return done(serr)
	}); err != nil {
		return err
	}
	return os.NewSyscallError("sendto", serr)
}
