package dnsfilter

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/miekg/dns"
)

// quickSeeds are datagrams of every shape quickParse meets: taken (plain
// names, EDNS with and without DO, header flags) and left to Unpack
// (compression, escapes, options, trailing bytes, two questions, the root).
func quickSeeds(t testing.TB) [][]byte {
	var out [][]byte
	add := func(m *dns.Msg) {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	q := func(name string, qtype uint16) *dns.Msg { return new(dns.Msg).SetQuestion(name, qtype) }
	add(q("example.com.", dns.TypeA))
	add(q("ExAmPle.CoM.", dns.TypeAAAA))
	add(q("_dmarc.a-b.example.com.", dns.TypeTXT))
	add(q(".", dns.TypeNS))
	add(q("a\\.b.example.com.", dns.TypeA))
	add(q("a\\000b.example.com.", dns.TypeA))
	m := q("example.com.", dns.TypeA).SetEdns0(1232, true)
	m.CheckingDisabled, m.AuthenticatedData, m.Zero, m.Truncated = true, true, true, true
	add(m)
	add(q("example.com.", dns.TypeHTTPS).SetEdns0(512, false))
	m = q("example.com.", dns.TypeA).SetEdns0(1232, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	add(m)
	m = q("example.com.", dns.TypeA).SetEdns0(1232, false)
	m.IsEdns0().SetVersion(1)
	m.IsEdns0().SetExtendedRcode(16)
	add(m)
	m = q("example.com.", dns.TypeA)
	m.Opcode = dns.OpcodeNotify
	add(m)
	m = q("example.com.", dns.TypeA)
	m.Question = append(m.Question, dns.Question{Name: "example.com.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	add(m)
	// The name of the second question as a compression pointer, and trailing bytes.
	b, _ := q("example.com.", dns.TypeA).Pack()
	out = append(out, append(append([]byte{}, b...), 0, 0))
	out = append(out, append(append([]byte{}, b[:12]...), 0xC0, 12, 0, 1, 0, 1))
	// Names of 255 wire octets (the longest) and 256, built by hand:
	// Pack refuses the second.
	for _, last := range []int{61, 62} {
		n := b[:12:12]
		for _, l := range []int{63, 63, 63, last} {
			n = append(n, byte(l))
			n = append(n, bytes.Repeat([]byte{'a'}, l)...)
		}
		out = append(out, append(n, 0, 0, 1, 0, 1))
	}
	return out
}

// FuzzQuickParse: whatever quickParse takes, Msg.Unpack takes too and
// gives the same message, field for field; the scratch is reused from one
// parse to the next, as in a batch, so nothing of the previous query may
// remain.
func FuzzQuickParse(f *testing.F) {
	seeds := quickSeeds(f)
	for _, b := range seeds {
		f.Add(b)
	}
	var sq scratchQuery
	f.Fuzz(func(t *testing.T, m []byte) {
		for _, before := range [][]byte{seeds[6], seeds[0], m} {
			sq.quickParse(before)
		}
		if !sq.quickParse(m) {
			return
		}
		full := new(dns.Msg)
		if err := full.Unpack(m); err != nil {
			t.Fatalf("quickParse took %x, which Unpack refuses: %v", m, err)
		}
		if !reflect.DeepEqual(&sq.msg, full) {
			t.Fatalf("quickParse(%x) =\n%#v\nUnpack gives\n%#v", m, &sq.msg, full)
		}
	})
}

// TestQuickParseTakesPlainQueries: the plain shapes are taken (the fast
// path is really used), the others left to Unpack.
func TestQuickParseTakesPlainQueries(t *testing.T) {
	seeds := quickSeeds(t)
	taken := []bool{true, true, true, false, false, false, true, true, false, true, true, false, false, false, true, false}
	var sq scratchQuery
	for i, b := range seeds {
		if got := sq.quickParse(b); got != taken[i] {
			t.Errorf("seed %d (%x): taken %v, want %v", i, b, got, taken[i])
		}
	}
}
