package dnsfilter

import (
	"encoding/binary"

	"github.com/miekg/dns"
)

// Parsing a plain query without miekg/dns. Nearly every datagram a guest
// sends is one shape: a header, one question whose name is uncompressed
// letters, digits, hyphens and underscores, and at most an OPT record
// without options. For those, quickParse fills a message the batched path
// reuses from datagram to datagram with what Msg.Unpack would give, field
// for field (FuzzQuickParse compares the two on every input), without its
// allocations and generic record parsing. Anything else is left to
// Msg.Unpack; the decision path that follows is the same either way.

// scratchQuery is the reusable storage of one datagram's parsed query.
type scratchQuery struct {
	msg      dns.Msg
	question [1]dns.Question
	opt      dns.OPT
	extra    [1]dns.RR
	// names maps the packed labels of recent question names to their
	// presentation (see presentation).
	names map[string]string
}

// quickParse parses m into sq.msg and reports whether it could; on false
// sq.msg is unspecified and m must be unpacked in full.
func (sq *scratchQuery) quickParse(m []byte) bool {
	if len(m) < 12 {
		return false
	}
	bits := binary.BigEndian.Uint16(m[2:])
	qd, an, ns, ar := binary.BigEndian.Uint16(m[4:]), binary.BigEndian.Uint16(m[6:]), binary.BigEndian.Uint16(m[8:]), binary.BigEndian.Uint16(m[10:])
	if bits&(1<<15) != 0 || qd != 1 || an != 0 || ns != 0 || ar > 1 {
		return false
	}
	// The question name: plain labels, no compression, no escapes.
	off := 12
	start := off
	for {
		if off >= len(m) {
			return false
		}
		l := int(m[off])
		if l == 0 {
			break
		}
		if l > 63 || off+1+l >= len(m) {
			return false
		}
		for _, c := range m[off+1 : off+1+l] {
			if !plainLabelByte(c) {
				return false
			}
		}
		off += 1 + l
	}
	if off == start || off+1-start > 255 { // the root, or a name too long
		return false
	}
	nameEnd := off
	off++
	if off+4 > len(m) {
		return false
	}
	qtype, qclass := binary.BigEndian.Uint16(m[off:]), binary.BigEndian.Uint16(m[off+2:])
	off += 4
	var optHdr dns.RR_Header
	if ar == 1 {
		// The OPT: root name, type, class (UDP size), TTL, empty RDATA.
		if off+11 != len(m) || m[off] != 0 || binary.BigEndian.Uint16(m[off+1:]) != dns.TypeOPT || binary.BigEndian.Uint16(m[off+9:]) != 0 {
			return false
		}
		optHdr = dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: binary.BigEndian.Uint16(m[off+3:]), Ttl: binary.BigEndian.Uint32(m[off+5:])}
		off += 11
	}
	if off != len(m) {
		return false // bytes after the last record: Unpack ignores them, leave it to decide
	}

	sq.msg = dns.Msg{MsgHdr: dns.MsgHdr{
		Id:                 binary.BigEndian.Uint16(m),
		Response:           false,
		Opcode:             int(bits>>11) & 0xF,
		Authoritative:      bits&(1<<10) != 0,
		Truncated:          bits&(1<<9) != 0,
		RecursionDesired:   bits&(1<<8) != 0,
		RecursionAvailable: bits&(1<<7) != 0,
		Zero:               bits&(1<<6) != 0,
		AuthenticatedData:  bits&(1<<5) != 0,
		CheckingDisabled:   bits&(1<<4) != 0,
		Rcode:              int(bits & 0xF),
	}}
	sq.question[0] = dns.Question{Name: sq.presentation(m[start:nameEnd]), Qtype: qtype, Qclass: qclass}
	sq.msg.Question = sq.question[:]
	if ar == 1 {
		sq.opt = dns.OPT{Hdr: optHdr}
		sq.extra[0] = &sq.opt
		sq.msg.Extra = sq.extra[:]
		sq.msg.Rcode |= sq.opt.ExtendedRcode()
	}
	return true
}

// presentation is the name of packed labels w (no root octet) as
// Msg.Unpack writes it: "label.label.". The strings of recent names are
// kept (a guest asks the same names again and again), up to
// maxPresentations; then they are forgotten all at once.
func (sq *scratchQuery) presentation(w []byte) string {
	if s, ok := sq.names[string(w)]; ok {
		return s
	}
	var b [255]byte
	n := 0
	for i := 0; i < len(w); {
		l := int(w[i])
		n += copy(b[n:], w[i+1:i+1+l])
		b[n] = '.'
		n++
		i += 1 + l
	}
	if sq.names == nil || len(sq.names) >= maxPresentations {
		sq.names = make(map[string]string)
	}
	s := string(b[:n])
	sq.names[string(w)] = s
	return s
}

// maxPresentations bounds the names a scratch query keeps.
const maxPresentations = 512

// plainLabelByte reports whether c appears in a label's presentation as
// itself (Msg.Unpack escapes '.', ' ', quotes, '@', ';', '(', ')', '\\'
// and bytes outside printable ASCII); only the bytes of host names and
// service labels are taken.
func plainLabelByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

// own makes up independent of the scratch query it was parsed into: it
// waits on the upstream, past the scratch's next use.
func (up *udpPending) own() {
	up.req = up.req.Copy()
	up.p.opt, _ = queryOPT(up.req)
}
