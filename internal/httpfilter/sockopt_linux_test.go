package httpfilter

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/abox-dev/abox/internal/httpfilter/connio"
)

// TestGuestConnCongestion: the sockets the proxy accepts from the guest use
// connio.GuestCongestion, whatever the host's default (connio/sockopt_linux.go says why).
func TestGuestConnCongestion(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"example.test"}})
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := congestion(t, c); got == connio.GuestCongestion {
		t.Logf("the host's default is %s already: this run proves little", got)
	}
	var server net.Conn
	for deadline := time.Now().Add(5 * time.Second); server == nil; {
		h.p.connsMu.Lock()
		for ic := range h.p.conns {
			server = ic.Conn
		}
		h.p.connsMu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the proxy registered no connection")
		}
		time.Sleep(time.Millisecond)
	}
	if got := congestion(t, server); got != connio.GuestCongestion {
		t.Fatalf("the guest's connection uses %q, want %q", got, connio.GuestCongestion)
	}
}

func congestion(t *testing.T, c net.Conn) string {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		name, gerr = unix.GetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	}); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return name
}
