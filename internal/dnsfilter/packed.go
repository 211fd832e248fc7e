package dnsfilter

import (
	"encoding/binary"
	"time"

	"github.com/miekg/dns"
)

// Packed answers. A checked entry keeps its answer packed once, as the
// reply to the query in lowercase without EDNS: ID 0, QR and RA set, the
// entry's rcode, compressed. Serving it to a UDP client is a copy with the
// client's ID, flags and spelling of the name written in, every TTL
// lowered by the entry's age, and our OPT record appended when the client
// sent EDNS: the same answer entry.reply builds, without building it. The
// packing does not decide anything: the policy, the rebinding check and
// the size limit are applied by the caller exactly as for the slow path,
// and an answer that would need truncating takes the slow path.

// optLen is the size of the OPT record we append: root name, type, class
// (our UDP size), TTL (extended rcode 0, version 0, flags), empty RDATA.
const optLen = 11

// pack builds e's packed answer to name (normalised) and qtype, or leaves
// wire nil when the answer is too large for any UDP client.
func (e *entry) pack(name string, qtype uint16) {
	m := new(dns.Msg)
	m.Response, m.RecursionAvailable, m.Rcode, m.Compress = true, true, e.rcode, true
	m.Question = []dns.Question{{Name: dns.Fqdn(name), Qtype: qtype, Qclass: dns.ClassINET}}
	m.Answer, m.Ns, m.Extra = e.answer, e.ns, e.extra
	b, err := m.Pack()
	if err != nil || len(b)+optLen > MaxUDPSize {
		return
	}
	_, off, err := dns.UnpackDomainName(b, 12)
	if err != nil {
		return
	}
	off += 4 // type, class
	var ttls []uint16
	for range len(e.answer) + len(e.ns) + len(e.extra) {
		rr, end, err := dns.UnpackRR(b, off)
		if err != nil {
			return
		}
		// name ... type(2) class(2) TTL(4) rdlength(2) rdata
		ttls = append(ttls, uint16(end-int(rr.Header().Rdlength)-6))
		off = end
	}
	if off != len(b) {
		return
	}
	e.wire, e.ttls = b, ttls
}

// packedReply writes e's answer to req into dst (reusing its storage) and
// reports whether it could: a packed form, the name of the question
// spelled as the entry's but for case, and an answer of at most size bytes.
func (e *entry) packedReply(dst []byte, req *dns.Msg, opt *dns.OPT, now time.Time, size int) ([]byte, bool) {
	n := len(e.wire)
	if opt != nil {
		n += optLen
	}
	if e.wire == nil || n > size || len(req.Question) != 1 {
		return nil, false
	}
	// The client's spelling: same labels, any case (DNS 0x20).
	var qn [256]byte
	l, err := dns.PackDomainName(req.Question[0].Name, qn[:], 0, nil, false)
	if err != nil || 12+l > len(e.wire) || !foldEqual(qn[:l], e.wire[12:12+l]) {
		return nil, false
	}
	b := append(dst[:0], e.wire...)
	binary.BigEndian.PutUint16(b, req.Id)
	flags := uint16(1<<15 | 1<<7 | e.rcode&0xF) // QR, RA, rcode
	if req.RecursionDesired {
		flags |= 1 << 8
	}
	if req.CheckingDisabled {
		flags |= 1 << 4
	}
	if opt != nil && e.ad && (opt.Do() || req.AuthenticatedData) {
		flags |= 1 << 5
	}
	binary.BigEndian.PutUint16(b[2:], flags)
	copy(b[12:], qn[:l])
	age := uint32(max(now.Sub(e.stored), 0) / time.Second)
	for _, o := range e.ttls {
		ttl := binary.BigEndian.Uint32(e.wire[o:])
		binary.BigEndian.PutUint32(b[o:], max(ttl-min(age, ttl), 1))
	}
	if opt != nil {
		var do byte
		if opt.Do() {
			do = 0x80
		}
		b = append(b, 0, 0, byte(dns.TypeOPT), MaxUDPSize>>8, MaxUDPSize&0xFF, 0, 0, do, 0, 0, 0)
		binary.BigEndian.PutUint16(b[10:], binary.BigEndian.Uint16(b[10:])+1)
	}
	return b, true
}

// foldEqual compares two packed names ignoring ASCII case. Length octets
// (at most 63) are never letters, so the comparison runs over all bytes.
func foldEqual(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// blockedWire packs into dst the NXDOMAIN blocked() builds for a name the
// policy refuses with reason and rule: the question as asked, and with
// EDNS our OPT carrying EDE 15 "reason=... rule=...". It reports false when
// that answer would not fit the client as it is (the slow path sheds).
func blockedWire(dst []byte, req *dns.Msg, reason, rule string) ([]byte, bool) {
	opt, _ := queryOPT(req)
	if len(req.Question) != 1 {
		return nil, false
	}
	q := req.Question[0]
	b := append(dst[:0], 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // the header, filled in below
	binary.BigEndian.PutUint16(b, req.Id)
	flags := uint16(1<<15 | 1<<7 | dns.RcodeNameError) // QR, RA, NXDOMAIN
	if req.RecursionDesired {
		flags |= 1 << 8
	}
	if req.CheckingDisabled {
		flags |= 1 << 4
	}
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], 1)
	var qn [256]byte
	l, err := dns.PackDomainName(q.Name, qn[:], 0, nil, false)
	if err != nil {
		return nil, false
	}
	b = append(b, qn[:l]...)
	b = binary.BigEndian.AppendUint16(b, q.Qtype)
	b = binary.BigEndian.AppendUint16(b, q.Qclass)
	if opt != nil {
		text := len("reason=") + len(reason)
		if rule != "" {
			text += len(" rule=") + len(rule)
		}
		var do byte
		if opt.Do() {
			do = 0x80
		}
		b = append(b, 0, 0, byte(dns.TypeOPT), MaxUDPSize>>8, MaxUDPSize&0xFF, 0, 0, do, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(4+2+text))             // RDATA: one option
		b = binary.BigEndian.AppendUint16(b, dns.EDNS0EDE)                 // option code
		b = binary.BigEndian.AppendUint16(b, uint16(2+text))               // option length
		b = binary.BigEndian.AppendUint16(b, dns.ExtendedErrorCodeBlocked) // info code
		b = append(append(b, "reason="...), reason...)
		if rule != "" {
			b = append(append(b, " rule="...), rule...)
		}
		binary.BigEndian.PutUint16(b[10:], 1)
	}
	if len(b) > maxSize(req, "udp") {
		return nil, false
	}
	return b, true
}
