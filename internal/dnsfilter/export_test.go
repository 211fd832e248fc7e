package dnsfilter

import (
	"context"
	"net/netip"
	"sync"
)

// AnswerDatagram answers datagram m from client as the batched UDP path
// does, waiting for the upstream when it must, and returns the datagram
// sent back (nil for none), in dst's storage. Successive calls share one
// scratch query, as the datagrams of a batch do.
func (s *Server) AnswerDatagram(ctx context.Context, m []byte, client netip.Addr, dst []byte) []byte {
	testScratch.Lock()
	defer testScratch.Unlock()
	return s.answerDatagram(ctx, &testScratch.sq, m, client, dst)
}

// AnswerDatagramUnpacked is AnswerDatagram with every query unpacked by
// miekg/dns (no quickParse).
func (s *Server) AnswerDatagramUnpacked(ctx context.Context, m []byte, client netip.Addr, dst []byte) []byte {
	return s.answerDatagram(ctx, nil, m, client, dst)
}

var testScratch struct {
	sync.Mutex
	sq scratchQuery
}

func (s *Server) answerDatagram(ctx context.Context, sq *scratchQuery, m []byte, client netip.Addr, dst []byte) []byte {
	resp, wire, p := s.udpQuery(ctx, sq, m, false, client, s.now(), nil, dst, nil)
	if p != nil {
		resp, _ = s.finish(ctx, p.req, &p.p, p.d)
		resp = s.conclude(p.client, "udp", p.req, resp, p.d, nil)
	}
	if resp != nil {
		b, err := resp.PackBuffer(dst)
		if err != nil {
			panic(err)
		}
		return b
	}
	return wire
}

// ReaderYields is the number of times UDP readers yielded their P so far.
func ReaderYields() uint64 { return readerYields.Load() }
