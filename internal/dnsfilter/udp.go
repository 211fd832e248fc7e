package dnsfilter

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Batched UDP serving. A socket bound to one address is read and written in
// batches (recvmmsg and sendmmsg on Linux): the reading goroutine answers at
// once every query that needs no upstream (blocked, refused, cached,
// healthcheck) and sends those answers together; a query that must go
// upstream gets a goroutine of its own, which sends its answer alone. At
// this filter's cost per query the system calls dominate, and one call per
// batch instead of two per query is most of the saving.
//
// A wildcard socket is left to miekg/dns, which reads and writes each
// datagram with a control message naming its local address, so that each
// answer leaves from the address its query was sent to.

const (
	// udpBatch is the number of datagrams one system call reads or writes.
	udpBatch = 32
	// udpReadSize is the largest query read whole. A query is at most a
	// question and an OPT record; a longer datagram is cut, flagged by the
	// kernel, and answered FORMERR as malformed.
	udpReadSize = 4096
	// maxUDPReaders bounds the goroutines reading one socket.
	maxUDPReaders = 4
)

// batchConn is the part of ipv4.PacketConn and ipv6.PacketConn used here.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// udpSocket is a socket served in batches.
type udpSocket struct {
	batchConn
	// send sends one answer; any goroutine may call it.
	send func(b []byte, to netip.AddrPort) error
	// stop makes the readers' reads fail soon; close releases the socket
	// once they returned.
	stop, close func()
	// poller: the socket is served through Go's poller (not detached).
	poller bool
}

// batchable returns pc as a UDP socket to serve in batches: one bound to a
// single address (not a wildcard). The socket is taken out of Go's poller
// when it can be (see blockingConn) and the process runs at least two Ps
// (GOMAXPROCS): a blocked reader holds its P in the system call, and with
// one P the rest of the process (the HTTP proxy of the same daemon, the
// queries waiting on the upstream) would wait for the runtime's monitor to
// take it back, up to 10 ms later. Otherwise the socket is served through
// the poller.
func batchable(pc net.PacketConn) (*udpSocket, bool) {
	c, ok := pc.(*net.UDPConn)
	if !ok {
		return nil, false
	}
	la, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || la.IP.IsUnspecified() {
		return nil, false
	}
	if runtime.GOMAXPROCS(0) >= 2 {
		if u, err := detached(c, la); err == nil {
			return u, true
		}
	}
	return &udpSocket{
		batchConn: packetConn(c, la),
		send:      func(b []byte, to netip.AddrPort) error { _, err := c.WriteToUDPAddrPort(b, to); return err },
		stop:      func() { c.SetReadDeadline(time.Unix(1, 0)) },
		close:     func() { c.Close() },
		poller:    true,
	}, true
}

// packetConn wraps c, bound to la, in x/net's PacketConn of la's family.
func packetConn(c net.PacketConn, la *net.UDPAddr) batchConn {
	if la.IP.To4() != nil {
		return ipv4.NewPacketConn(c)
	}
	return ipv6.NewPacketConn(c)
}

// serveUDP answers the datagrams of u until ctx ends, then waits up to
// five seconds for the queries still waiting on the upstream, and closes u.
func (s *Server) serveUDP(ctx context.Context, u *udpSocket) error {
	var pending sync.WaitGroup
	stop := context.AfterFunc(ctx, u.stop)
	defer stop()
	// Readers blocked in a receive hold a P each: one P is always left
	// to the rest of the process.
	readers := runtime.GOMAXPROCS(0)
	if !u.poller {
		readers--
	}
	readers = min(max(readers, 1), maxUDPReaders)
	errs := make(chan error, readers)
	for range readers {
		go func() { errs <- s.readUDPContained(ctx, u, &pending) }()
	}
	var err error
	for range readers {
		if e := <-errs; e != nil && err == nil {
			err = e
			u.stop() // stop the other readers
		}
	}
	done := make(chan struct{})
	go func() { pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	u.close()
	return err
}

// udpSlot is one datagram of a batch, in and out; bufs is the one-buffer
// list its answer is sent from.
type udpSlot struct {
	in, out []byte
	bufs    [][]byte
}

// readUDPContained runs readUDP and runs it again after a panic: the
// datagrams of the batch being answered get no answer (their clients
// retransmit), the socket keeps its reader and the daemon keeps running.
func (s *Server) readUDPContained(ctx context.Context, u *udpSocket, pending *sync.WaitGroup) error {
	for {
		if panicked, err := s.readUDPOnce(ctx, u, pending); !panicked {
			return err
		}
	}
}

func (s *Server) readUDPOnce(ctx context.Context, u *udpSocket, pending *sync.WaitGroup) (panicked bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.panics.Report("dns datagram batch", v)
			panicked = true
		}
	}()
	return false, s.readUDP(ctx, u, pending)
}

// readUDP is one reading goroutine: read a batch, answer what can be
// answered now, send those answers in one call, repeat.
func (s *Server) readUDP(ctx context.Context, u *udpSocket, pending *sync.WaitGroup) error {
	in := make([]ipv4.Message, udpBatch)
	out := make([]ipv4.Message, 0, udpBatch)
	slots := make([]udpSlot, udpBatch)
	// Each datagram is parsed, decided and packed before the next: one
	// scratch query serves them all.
	var sq scratchQuery
	for i := range in {
		slots[i].in = make([]byte, udpReadSize)
		slots[i].out = make([]byte, 0, MaxUDPSize)
		slots[i].bufs = make([][]byte, 1)
		in[i].Buffers = [][]byte{slots[i].in}
	}
	for {
		n, err := u.ReadBatch(in, recvFlags)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, net.ErrClosed) {
				return nil // stopped by a sibling reader's failure
			}
			if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EINTR) {
				// Transient. ECONNREFUSED is an ICMP error of an earlier
				// answer; EINTR a signal during a receive with a timeout,
				// which the kernel does not restart.
				continue
			}
			return err
		}
		out = out[:0]
		for i := range n {
			m := &in[i]
			ua, ok := m.Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			from := ua.AddrPort()
			resp, b, p := s.udpQuery(ctx, &sq, slots[i].in[:m.N], m.Flags&syscall.MSG_TRUNC != 0, from.Addr().Unmap(), slots[i].out)
			if p != nil {
				pending.Add(1)
				go func() {
					defer pending.Done()
					defer func() {
						if v := recover(); v != nil {
							s.panics.Report("dns query", v, "client", from.String())
						}
					}()
					s.finishUDP(ctx, u, from, p)
				}()
				continue
			}
			if resp != nil {
				var err error
				if b, err = resp.PackBuffer(slots[i].out[:0]); err != nil {
					s.st.writeErrors.Add(1)
					continue
				}
			}
			if b == nil {
				continue
			}
			slots[i].bufs[0] = b
			out = append(out, ipv4.Message{Buffers: slots[i].bufs, Addr: m.Addr})
		}
		s.sendUDP(u, out)
	}
}

// sendUDP sends the answers of one batch; a datagram the kernel refuses is
// counted and skipped.
func (s *Server) sendUDP(bc batchConn, out []ipv4.Message) {
	for len(out) > 0 {
		n, err := bc.WriteBatch(out, 0)
		if errors.Is(err, syscall.EINTR) {
			// A signal before anything was sent (a send with a timeout
			// is not restarted): again.
			out = out[max(n, 0):]
			continue
		}
		if err != nil {
			// The first message failed (an unreachable client, a full
			// buffer): count it and go on with the rest.
			s.st.writeErrors.Add(1)
			n = max(n, 1)
		}
		out = out[n:]
	}
}

// udpPending is a UDP query waiting on the upstream.
type udpPending struct {
	req    *dns.Msg
	client netip.Addr
	d      decision
	p      *pending
}

// finishUDP completes a query that went upstream and sends its answer.
func (s *Server) finishUDP(ctx context.Context, u *udpSocket, to netip.AddrPort, up *udpPending) {
	resp, d := s.finish(ctx, up.req, up.p, up.d)
	resp = s.conclude(up.client, "udp", up.req, resp, d)
	b, err := resp.Pack()
	if err == nil {
		err = u.send(b, to)
	}
	if err != nil {
		s.st.writeErrors.Add(1)
	}
}

// udpQuery parses datagram m from client as miekg/dns's server would (the
// same accept function, FORMERR for what is rejected or does not parse,
// nothing for a short datagram or a response) and answers it, unless it
// must wait on the upstream: then the pending query is returned. A plain
// query is parsed into sq (see quickParse): a response returned must be
// packed before sq's next use (a pending query is returned with a copy of
// its own). Without sq, every query is unpacked by miekg/dns.
func (s *Server) udpQuery(ctx context.Context, sq *scratchQuery, m []byte, cut bool, client netip.Addr, dst []byte) (*dns.Msg, []byte, *udpPending) {
	if len(m) < 12 {
		s.invalid(m, dns.ErrShortRead)
		return nil, nil, nil
	}
	dh := dns.Header{
		Id: binary.BigEndian.Uint16(m), Bits: binary.BigEndian.Uint16(m[2:]),
		Qdcount: binary.BigEndian.Uint16(m[4:]), Ancount: binary.BigEndian.Uint16(m[6:]),
		Nscount: binary.BigEndian.Uint16(m[8:]), Arcount: binary.BigEndian.Uint16(m[10:]),
	}
	accept := s.acceptQuery(dh)
	if accept == dns.MsgIgnore {
		return nil, nil, nil
	}
	if accept == dns.MsgAccept && !cut && sq != nil && sq.quickParse(m) {
		resp, b, p := s.handleNow(ctx, client, &sq.msg, dst)
		if p != nil {
			p.own() // it outlives sq's next use
		}
		return resp, b, p
	}
	req := new(dns.Msg)
	if accept == dns.MsgAccept {
		err := req.Unpack(m)
		if err == nil && cut {
			err = errCut
		}
		if err == nil {
			return s.handleNow(ctx, client, req, dst)
		}
		s.invalid(m, err)
	} else { // rejected: the header alone
		req.Unpack(m[:12])
	}
	req.SetRcodeFormatError(req)
	req.Zero = false
	req.Answer, req.Ns, req.Extra = nil, nil, nil
	if len(req.Question) > 1 { // acceptQuery refuses these; never echo them
		req.Question = nil
	}
	return req, nil, nil
}

var errCut = errors.New("datagram longer than " + strconv.Itoa(udpReadSize) + " bytes")
