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

// batchable returns pc as a UDP socket to serve in batches: one bound to a
// single address (not a wildcard).
func batchable(pc net.PacketConn) (*net.UDPConn, batchConn, bool) {
	c, ok := pc.(*net.UDPConn)
	if !ok {
		return nil, nil, false
	}
	la, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok || la.IP.IsUnspecified() {
		return nil, nil, false
	}
	if la.IP.To4() != nil {
		return c, ipv4.NewPacketConn(c), true
	}
	return c, ipv6.NewPacketConn(c), true
}

// serveUDP answers the datagrams of c until ctx ends, then waits up to
// five seconds for the queries still waiting on the upstream.
func (s *Server) serveUDP(ctx context.Context, c *net.UDPConn, bc batchConn) error {
	var pending sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { c.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	readers := min(runtime.GOMAXPROCS(0), maxUDPReaders)
	errs := make(chan error, readers)
	for range readers {
		go func() { errs <- s.readUDP(ctx, c, bc, &pending) }()
	}
	var err error
	for range readers {
		if e := <-errs; e != nil && err == nil {
			err = e
			c.SetReadDeadline(time.Unix(1, 0)) // stop the other readers
		}
	}
	done := make(chan struct{})
	go func() { pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
	return err
}

// udpSlot is one datagram of a batch, in and out; bufs is the one-buffer
// list its answer is sent from.
type udpSlot struct {
	in, out []byte
	bufs    [][]byte
}

// readUDP is one reading goroutine: read a batch, answer what can be
// answered now, send those answers in one call, repeat.
func (s *Server) readUDP(ctx context.Context, c *net.UDPConn, bc batchConn, pending *sync.WaitGroup) error {
	in := make([]ipv4.Message, udpBatch)
	out := make([]ipv4.Message, 0, udpBatch)
	slots := make([]udpSlot, udpBatch)
	for i := range in {
		slots[i].in = make([]byte, udpReadSize)
		slots[i].out = make([]byte, 0, MaxUDPSize)
		slots[i].bufs = make([][]byte, 1)
		in[i].Buffers = [][]byte{slots[i].in}
	}
	for {
		n, err := bc.ReadBatch(in, 0)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil // stopped by a sibling reader's failure
			}
			if errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ECONNREFUSED) {
				continue // transient; ECONNREFUSED is an ICMP error of an earlier answer
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
			resp, b, p := s.udpQuery(ctx, slots[i].in[:m.N], m.Flags&syscall.MSG_TRUNC != 0, from.Addr().Unmap(), slots[i].out)
			if p != nil {
				pending.Add(1)
				go func() {
					defer pending.Done()
					s.finishUDP(ctx, c, from, p)
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
		s.sendUDP(bc, out)
	}
}

// sendUDP sends the answers of one batch; a datagram the kernel refuses is
// counted and skipped.
func (s *Server) sendUDP(bc batchConn, out []ipv4.Message) {
	for len(out) > 0 {
		n, err := bc.WriteBatch(out, 0)
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
func (s *Server) finishUDP(ctx context.Context, c *net.UDPConn, to netip.AddrPort, up *udpPending) {
	resp, d := s.finish(ctx, up.req, up.p, up.d)
	resp = s.conclude(up.client, "udp", up.req, resp, d)
	b, err := resp.Pack()
	if err == nil {
		_, err = c.WriteToUDPAddrPort(b, to)
	}
	if err != nil {
		s.st.writeErrors.Add(1)
	}
}

// udpQuery parses datagram m from client as miekg/dns's server would (the
// same accept function, FORMERR for what is rejected or does not parse,
// nothing for a short datagram or a response) and answers it, unless it
// must wait on the upstream: then the pending query is returned.
func (s *Server) udpQuery(ctx context.Context, m []byte, cut bool, client netip.Addr, dst []byte) (*dns.Msg, []byte, *udpPending) {
	if len(m) < 12 {
		s.invalid(m, dns.ErrShortRead)
		return nil, nil, nil
	}
	dh := dns.Header{
		Id: binary.BigEndian.Uint16(m), Bits: binary.BigEndian.Uint16(m[2:]),
		Qdcount: binary.BigEndian.Uint16(m[4:]), Ancount: binary.BigEndian.Uint16(m[6:]),
		Nscount: binary.BigEndian.Uint16(m[8:]), Arcount: binary.BigEndian.Uint16(m[10:]),
	}
	req := new(dns.Msg)
	switch s.acceptQuery(dh) {
	case dns.MsgIgnore:
		return nil, nil, nil
	case dns.MsgAccept:
		err := req.Unpack(m)
		if err == nil && cut {
			err = errCut
		}
		if err == nil {
			return s.handleNow(ctx, client, req, dst)
		}
		s.invalid(m, err)
	default: // rejected: the header alone
		req.Unpack(m[:12])
	}
	req.SetRcodeFormatError(req)
	req.Zero = false
	req.Answer, req.Ns, req.Extra = nil, nil, nil
	return req, nil, nil
}

var errCut = errors.New("datagram longer than " + strconv.Itoa(udpReadSize) + " bytes")
