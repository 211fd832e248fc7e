package dnsfilter

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
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
	// udpBatchLen is the number of datagrams one system call reads or writes.
	udpBatchLen = 32
	// udpReadSize is the largest query read whole. A query is at most a
	// question and an OPT record; a longer datagram is cut, flagged by the
	// kernel, and answered FORMERR as malformed.
	udpReadSize = 4096
	// maxUDPReaders bounds the goroutines reading one socket.
	maxUDPReaders = 4
	// readerYield is how often a reader under load yields its P. A reader
	// never reschedules by itself (a blocking receive keeps it on its
	// thread), and after 10 ms on one time slice the runtime's monitor
	// preempts it; it is in a system call most of that time (a receive or
	// a send), and a P in a system call is taken from it and handed to
	// another thread. Each such handoff costs the reader a thread switch
	// when its call returns and puts the monitor back to waking every
	// 20 µs for a while: under load the monitor's thread alone used 8% of
	// the filter's CPU. Yielding first costs one pass through the
	// scheduler every few milliseconds.
	readerYield = 5 * time.Millisecond
)

// udpSocket is a socket served in batches.
type udpSocket struct {
	// batch makes the batch of one reading goroutine, over its slots.
	batch func(slots []udpSlot) udpBatch
	// send sends one answer; any goroutine may call it.
	send func(b []byte, to netip.AddrPort) error
	// stop makes the readers' reads fail soon; close releases the socket
	// once they returned.
	stop, close func()
	// poller: the socket is served through Go's poller (not detached).
	poller bool
}

// udpBatch reads and writes the datagrams of one reader's slots.
type udpBatch interface {
	// read waits for datagrams and reads as many as are queued, one per
	// slot, at least one; it fills in their slots' n, cut and from, and
	// empties the queue of answers.
	read() (int, error)
	// answer queues b, the answer to the datagram of slot i.
	answer(i int, b []byte)
	// queued is the number of answers queued since the last read.
	queued() int
	// write sends the queued answers from the k-th on in one call and
	// returns how many went out; on an error the k-th did not.
	write(k int) (int, error)
}

// udpSlot is one datagram of a batch, in and out.
type udpSlot struct {
	in, out []byte
	n       int            // bytes of in read
	cut     bool           // the datagram was longer than in
	from    netip.AddrPort // the sender; invalid when not a UDP address
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
		if u, err := detached(c); err == nil {
			return u, true
		}
	}
	var bc batchConn = ipv6.NewPacketConn(c)
	if la.IP.To4() != nil {
		bc = ipv4.NewPacketConn(c)
	}
	return &udpSocket{
		batch:  func(slots []udpSlot) udpBatch { return newXnetBatch(bc, slots) },
		send:   func(b []byte, to netip.AddrPort) error { _, err := c.WriteToUDPAddrPort(b, to); return err },
		stop:   func() { c.SetReadDeadline(time.Unix(1, 0)) },
		close:  func() { c.Close() },
		poller: true,
	}, true
}

// batchConn is the part of ipv4.PacketConn and ipv6.PacketConn used here.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// xnetBatch is a batch read and written by x/net's PacketConn, on a socket
// in Go's poller.
type xnetBatch struct {
	c       batchConn
	slots   []udpSlot
	in, out []ipv4.Message
	bufs    [][]byte // the one-buffer lists of out, one per slot
}

func newXnetBatch(c batchConn, slots []udpSlot) *xnetBatch {
	b := &xnetBatch{c: c, slots: slots, in: make([]ipv4.Message, len(slots)), out: make([]ipv4.Message, 0, len(slots)), bufs: make([][]byte, len(slots))}
	for i := range slots {
		b.in[i].Buffers = [][]byte{slots[i].in}
	}
	return b
}

func (b *xnetBatch) read() (int, error) {
	b.out = b.out[:0]
	n, err := b.c.ReadBatch(b.in, recvFlags)
	for i := range max(n, 0) {
		m, sl := &b.in[i], &b.slots[i]
		sl.n, sl.cut, sl.from = m.N, m.Flags&syscall.MSG_TRUNC != 0, netip.AddrPort{}
		if ua, ok := m.Addr.(*net.UDPAddr); ok {
			sl.from = ua.AddrPort()
		}
	}
	return n, err
}

func (b *xnetBatch) answer(i int, p []byte) {
	b.bufs[i] = p
	b.out = append(b.out, ipv4.Message{Buffers: b.bufs[i : i+1], Addr: b.in[i].Addr})
}

func (b *xnetBatch) queued() int { return len(b.out) }

func (b *xnetBatch) write(k int) (int, error) { return b.c.WriteBatch(b.out[k:], 0) }

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
	slots := make([]udpSlot, udpBatchLen)
	for i := range slots {
		slots[i].in = make([]byte, udpReadSize)
		slots[i].out = make([]byte, 0, MaxUDPSize)
	}
	bt := u.batch(slots)
	// Each datagram is parsed, decided and packed before the next: one
	// scratch query serves them all. Their decision lines are queued
	// together, before their answers leave.
	var sq scratchQuery
	var lines decisionlog.Batch
	var pm policyMemo
	lastYield := s.now()
	for {
		n, err := bt.read()
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
		now := s.now()
		for i := range n {
			sl := &slots[i]
			if !sl.from.IsValid() {
				continue
			}
			from := sl.from
			resp, b, p := s.udpQuery(ctx, &sq, sl.in[:sl.n], sl.cut, from.Addr().Unmap(), now, &pm, sl.out, &lines)
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
				if b, err = resp.PackBuffer(sl.out[:0]); err != nil {
					s.st.writeErrors.Add(1)
					continue
				}
			}
			if len(b) == 0 {
				continue
			}
			bt.answer(i, b)
		}
		if lines.Len() > 0 {
			s.dlog.EmitBatch(&lines)
		}
		s.sendUDP(bt)
		if now.Sub(lastYield) >= readerYield {
			// Once the answers are out (see readerYield).
			readerYields.Add(1)
			runtime.Gosched()
			lastYield = now
		}
	}
}

// readerYields counts the yields of every reader (for tests).
var readerYields atomic.Uint64

// sendUDP sends the answers queued in bt; a datagram the kernel refuses is
// counted and skipped.
func (s *Server) sendUDP(bt udpBatch) {
	for k, q := 0, bt.queued(); k < q; {
		n, err := bt.write(k)
		if errors.Is(err, syscall.EINTR) {
			// A signal before anything was sent (a send with a timeout
			// is not restarted): again.
			k += max(n, 0)
			continue
		}
		if err != nil {
			// The first message failed (an unreachable client, a full
			// buffer): count it and go on with the rest.
			s.st.writeErrors.Add(1)
			n = max(n, 1)
		}
		k += n
	}
}

// udpPending is a UDP query waiting on the upstream.
type udpPending struct {
	req    *dns.Msg
	client netip.Addr
	d      decision
	p      pending
}

// finishUDP completes a query that went upstream and sends its answer.
func (s *Server) finishUDP(ctx context.Context, u *udpSocket, to netip.AddrPort, up *udpPending) {
	resp, d := s.finish(ctx, up.req, &up.p, up.d)
	resp = s.conclude(up.client, "udp", up.req, resp, d, nil)
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
// its own). Without sq, every query is unpacked by miekg/dns. The datagram
// came in at now; pm is the reader's memo of name decisions (or nil), and
// the decision line goes to lb when it is not nil.
func (s *Server) udpQuery(ctx context.Context, sq *scratchQuery, m []byte, cut bool, client netip.Addr, now time.Time, pm *policyMemo, dst []byte, lb *decisionlog.Batch) (*dns.Msg, []byte, *udpPending) {
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
		resp, b, p := s.handleNow(ctx, client, &sq.msg, now, pm, dst, lb)
		if p != nil {
			p.own() // it outlives sq's next use
		}
		return resp, b, p
	}
	req := new(dns.Msg)
	d := decision{at: now, verdict: allowlist.Block, rcode: dns.RcodeFormatError}
	if accept == dns.MsgAccept {
		err := req.Unpack(m)
		if err == nil && cut {
			err = errCut
		}
		if err == nil {
			return s.handleNow(ctx, client, req, now, pm, dst, lb)
		}
		s.invalid(m, err)
		d.reason, d.err = ReasonUnparsable, err
	} else { // rejected: the header alone
		req.Unpack(m[:12])
		d.reason = ReasonMalformed
		if dh.Qdcount != 1 {
			d.reason = ReasonQuestionCount
		}
	}
	if len(req.Question) == 1 {
		d.name, d.qtype = strings.TrimSuffix(req.Question[0].Name, "."), req.Question[0].Qtype
	}
	// A refusal like the others: a line within the client's budget.
	s.logDecision(client, d, lb)
	req.SetRcodeFormatError(req)
	req.Zero = false
	req.Answer, req.Ns, req.Extra = nil, nil, nil
	if len(req.Question) > 1 { // acceptQuery refuses these; never echo them
		req.Question = nil
	}
	return req, nil, nil
}

var errCut = errors.New("datagram longer than " + strconv.Itoa(udpReadSize) + " bytes")
