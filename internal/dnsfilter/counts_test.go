package dnsfilter_test

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/dnsfilter"
)

// sendRaw sends b over UDP and returns the parsed answer, or nil when none
// came within a second.
func (h *harness) sendRaw(t *testing.T, b []byte) *dns.Msg {
	t.Helper()
	c, err := net.Dial("udp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	m := new(dns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

// TestSectionCountsValidated: a query whose header counts are not those of a
// query, or promise records it does not hold, is answered FORMERR or not at
// all, and never forwarded. (Bytes after the last record are ignored by the
// parser: nothing reads them, and the upstream only ever sees a query the
// filter builds.)
func TestSectionCountsValidated(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "example.com\n"})
	good, err := query("example.com", dns.TypeA, 0).Pack()
	if err != nil {
		t.Fatal(err)
	}
	set := func(b []byte, off int, v uint16) []byte {
		c := append([]byte(nil), b...)
		binary.BigEndian.PutUint16(c[off:], v)
		return c
	}
	for name, b := range map[string][]byte{
		"answer count without records":     set(good, 6, 3),
		"authority count without records":  set(good, 8, 1),
		"additional count without records": set(good, 10, 2),
		"question count two, one present":  set(good, 4, 2),
		"question count zero, one present": set(good, 4, 0),
	} {
		t.Run(name, func(t *testing.T) {
			before := h.up.Count()
			r := h.sendRaw(t, b)
			if r != nil && r.Rcode != dns.RcodeFormatError {
				t.Errorf("rcode %s, want FORMERR or no answer", dns.RcodeToString[r.Rcode])
			}
			if h.up.Count() != before {
				t.Errorf("forwarded upstream")
			}
		})
	}
}

// TestIdleTCPCannotStarve: a client holding every TCP slot with idle or
// trickling connections does not keep a new TCP query from being answered:
// the quietest connection is closed to make room.
func TestIdleTCPCannotStarve(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "example.com\n", tweak: func(c *dnsfilter.Config) { c.MaxTCPConns = 4 }})
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i%2 == 1 {
			c.Write([]byte{0}) // one byte of a length prefix, then nothing
		}
	}
	time.Sleep(50 * time.Millisecond) // let the server accept them all
	for i := 0; i < 3; i++ {
		r, _, err := (&dns.Client{Net: "tcp", Timeout: clientTimeout}).Exchange(query("example.com", dns.TypeA, 0), h.addr)
		if err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("TCP query %d with every slot held: %v %v", i, r, err)
		}
	}
	if st := h.srv.Snapshot(); st.TCPEvicted == 0 {
		t.Errorf("tcp_evicted = 0")
	}
	warned := 0
	for _, l := range h.logs.lines(t) {
		if strings.HasPrefix(fmt.Sprint(l["msg"]), "dns tcp connection limit reached") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings of the TCP limit, want 1 (then one per %s)", warned, "10s")
	}
}

// TestRefusalFloodAggregated: a guest looping on a blocked name writes its
// budget of decision lines; the rest are counted, and status says so.
func TestRefusalFloodAggregated(t *testing.T) {
	h := start(t, harnessOptions{})
	const n = 200
	c := &dns.Client{Timeout: 3 * time.Second}
	for i := 0; i < n; i++ {
		if _, _, err := c.Exchange(query("flood.blocked.test", dns.TypeA, 0), h.addr); err != nil {
			t.Fatal(err)
		}
	}
	written := 0
	for _, l := range h.logs.lines(t) {
		if l["msg"] == "dns" && l["name"] == "flood.blocked.test" {
			written++
		}
	}
	st := h.srv.Snapshot()
	if written > decisionlog.DefaultRefusalsPerClient || st.LogSuppressed != uint64(n-written) {
		t.Errorf("%d lines written, %d suppressed; want at most %d lines and the rest counted", written, st.LogSuppressed, decisionlog.DefaultRefusalsPerClient)
	}
}
