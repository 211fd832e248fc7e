package dnsfilter

import (
	"context"
	"net/netip"
)

// AnswerDatagram answers datagram m from client as the batched UDP path
// does, waiting for the upstream when it must, and returns the datagram
// sent back (nil for none), in dst's storage.
func (s *Server) AnswerDatagram(ctx context.Context, m []byte, client netip.Addr, dst []byte) []byte {
	resp, wire, p := s.udpQuery(ctx, m, false, client, dst)
	if p != nil {
		resp, _ = s.finish(ctx, p.req, p.p, p.d)
		resp = s.conclude(p.client, "udp", p.req, resp, p.d)
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
