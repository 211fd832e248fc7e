package dnsfilter

import (
	"context"
	"net/netip"
)

// AnswerDatagram answers datagram m from client as the batched UDP path
// does, waiting for the upstream when it must, and returns the datagram
// sent back (nil for none).
func (s *Server) AnswerDatagram(ctx context.Context, m []byte, client netip.Addr) []byte {
	resp, wire, p := s.udpQuery(ctx, m, false, client, make([]byte, 0, MaxUDPSize))
	if p != nil {
		resp, _ = s.finish(ctx, p.req, p.p, p.d)
		resp = s.conclude(p.client, "udp", p.req, resp, p.d)
	}
	if resp != nil {
		b, err := resp.Pack()
		if err != nil {
			panic(err)
		}
		return b
	}
	return wire
}
