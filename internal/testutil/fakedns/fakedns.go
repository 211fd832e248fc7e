// Package fakedns is a programmable DNS server on loopback for tests: it
// answers from records set by the test, can delay, truncate or fail, and
// records every query it receives.
package fakedns

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Query is one message the server received.
type Query struct {
	// Net is "udp" or "tcp".
	Net string
	Msg *dns.Msg
}

// Handler builds a custom response for a query; returning nil falls back to
// the zone.
type Handler func(req *dns.Msg) *dns.Msg

// Server is a fake authoritative server for any name. The zero value is not
// usable; call New.
type Server struct {
	// Addr is the host:port the server answers on, for UDP and TCP alike,
	// set by Start.
	Addr string

	mu sync.Mutex
	// rrs holds records by lowercase FQDN owner, in insertion order.
	rrs      map[string][]dns.RR
	extra    map[string][]dns.RR
	handlers map[string]Handler
	delay    map[string]time.Duration
	rcode    map[string]int
	// truncate makes every UDP answer TC with empty sections.
	truncate bool
	// drop makes the server read queries and never answer them.
	drop bool
	// loss is the share of UDP queries read and never answered, drawn
	// from lossRand (seeded, so a test run is repeatable).
	loss     float64
	lossRand *rand.Rand
	queries  []Query

	udp, tcp *dns.Server
}

// New returns a server with an empty zone.
func New() *Server {
	return &Server{
		rrs:      map[string][]dns.RR{},
		extra:    map[string][]dns.RR{},
		handlers: map[string]Handler{},
		delay:    map[string]time.Duration{},
		rcode:    map[string]int{},
	}
}

// TB is the part of testing.TB that StartT needs.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// StartT starts a server on 127.0.0.1 and stops it when the test ends.
func StartT(t TB) *Server {
	t.Helper()
	s := New()
	if err := s.Start("127.0.0.1:0"); err != nil {
		t.Fatalf("starting fake DNS server: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Start listens on addr for UDP and TCP (the same port for both; port 0
// picks a free one) and serves in the background.
func (s *Server) Start(addr string) error {
	var pc net.PacketConn
	var ln net.Listener
	var err error
	for range 20 {
		pc, err = net.ListenPacket("udp", addr)
		if err != nil {
			return fmt.Errorf("fake dns: %w", err)
		}
		ln, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		if !strings.HasSuffix(addr, ":0") {
			return fmt.Errorf("fake dns: %w", err)
		}
	}
	if err != nil {
		return fmt.Errorf("fake dns: %w", err)
	}
	s.Addr = pc.LocalAddr().String()
	udpUp, tcpUp := make(chan struct{}), make(chan struct{})
	s.udp = &dns.Server{PacketConn: pc, Handler: s.handlerFor("udp"), NotifyStartedFunc: func() { close(udpUp) }}
	s.tcp = &dns.Server{Listener: ln, Handler: s.handlerFor("tcp"), NotifyStartedFunc: func() { close(tcpUp) }}
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	<-udpUp
	<-tcpUp
	return nil
}

// Close stops the server.
func (s *Server) Close() {
	if s.udp != nil {
		s.udp.Shutdown()
	}
	if s.tcp != nil {
		s.tcp.Shutdown()
	}
}

// Add parses records in zone-file syntax ("example.com. 60 IN A 1.2.3.4")
// and adds them. It panics on a syntax error: records are test constants.
func (s *Server) Add(records ...string) *Server {
	for _, r := range records {
		rr, err := dns.NewRR(r)
		if err != nil || rr == nil {
			panic(fmt.Sprintf("fakedns: bad record %q: %v", r, err))
		}
		s.AddRR(rr)
	}
	return s
}

// AddText is Add returning an error instead of panicking, for zone text
// that is not a test constant.
func (s *Server) AddText(records ...string) error {
	for _, r := range records {
		rr, err := dns.NewRR(r)
		if err != nil {
			return fmt.Errorf("record %q: %w", r, err)
		}
		if rr == nil {
			return fmt.Errorf("record %q: empty", r)
		}
		s.AddRR(rr)
	}
	return nil
}

// AddRR adds records to the zone.
func (s *Server) AddRR(rrs ...dns.RR) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rr := range rrs {
		k := key(rr.Header().Name)
		s.rrs[k] = append(s.rrs[k], rr)
	}
	return s
}

// AddExtra puts records into the additional section of every answer for name.
func (s *Server) AddExtra(name string, records ...string) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range records {
		rr, err := dns.NewRR(r)
		if err != nil || rr == nil {
			panic(fmt.Sprintf("fakedns: bad record %q: %v", r, err))
		}
		s.extra[key(name)] = append(s.extra[key(name)], rr)
	}
	return s
}

// Handle answers queries for name with h instead of the zone.
func (s *Server) Handle(name string, h Handler) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers[key(name)] = h
	return s
}

// SetDelay delays answers for name by d.
func (s *Server) SetDelay(name string, d time.Duration) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay[key(name)] = d
	return s
}

// SetRcode answers queries for name with rcode and no records.
func (s *Server) SetRcode(name string, rcode int) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rcode[key(name)] = rcode
	return s
}

// SetTruncate makes every UDP answer truncated (TC, empty), forcing TCP.
func (s *Server) SetTruncate(on bool) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.truncate = on
	return s
}

// SetDrop makes the server swallow queries without answering.
func (s *Server) SetDrop(on bool) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop = on
	return s
}

// SetLoss makes the server drop the given share (0..1) of UDP queries
// without answering, like a congested resolver or path; the choice is
// pseudo-random with a fixed seed. TCP is never dropped.
func (s *Server) SetLoss(share float64) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loss, s.lossRand = share, rand.New(rand.NewPCG(1, 2))
	return s
}

// Queries returns copies of the messages received so far.
func (s *Server) Queries() []Query {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Query, len(s.queries))
	for i, q := range s.queries {
		out[i] = Query{Net: q.Net, Msg: q.Msg.Copy()}
	}
	return out
}

// Count is the number of queries received.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queries)
}

// CountFor is the number of queries received for name (any type).
func (s *Server) CountFor(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.queries {
		if len(q.Msg.Question) > 0 && key(q.Msg.Question[0].Name) == key(name) {
			n++
		}
	}
	return n
}

// Reset forgets the recorded queries.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries = nil
}

func key(name string) string { return strings.ToLower(dns.Fqdn(name)) }

func (s *Server) handlerFor(network string) dns.HandlerFunc {
	return func(w dns.ResponseWriter, req *dns.Msg) {
		s.mu.Lock()
		s.queries = append(s.queries, Query{Net: network, Msg: req.Copy()})
		drop, trunc := s.drop, s.truncate && network == "udp"
		if network == "udp" && s.loss > 0 && s.lossRand.Float64() < s.loss {
			drop = true
		}
		var name string
		if len(req.Question) > 0 {
			name = key(req.Question[0].Name)
		}
		delay := s.delay[name]
		h := s.handlers[name]
		s.mu.Unlock()
		if drop {
			return
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		var resp *dns.Msg
		if h != nil {
			resp = h(req)
		}
		if resp == nil {
			resp = s.answer(req)
		}
		if trunc {
			resp.Answer, resp.Ns, resp.Extra = nil, nil, nil
			resp.Truncated = true
		}
		if network == "udp" && h == nil {
			// Like a real server: fit the requester's UDP size, setting TC.
			size := dns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				size = int(opt.UDPSize())
			}
			resp.Truncate(size)
		}
		w.WriteMsg(resp)
	}
}

// answer builds an authoritative answer from the zone, following CNAMEs.
func (s *Server) answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	s.mu.Lock()
	defer s.mu.Unlock()
	name := key(q.Name)
	if rc, ok := s.rcode[name]; ok {
		m.Rcode = rc
		return m
	}
	if _, ok := s.rrs[name]; !ok {
		m.Rcode = dns.RcodeNameError
		return m
	}
	m.Extra = append(m.Extra, s.extra[name]...)
	seen := map[string]bool{}
	for range 16 {
		seen[name] = true
		var cname *dns.CNAME
		found := false
		for _, rr := range s.rrs[name] {
			t := rr.Header().Rrtype
			if t == q.Qtype || q.Qtype == dns.TypeANY {
				m.Answer = append(m.Answer, dns.Copy(rr))
				found = true
			} else if c, ok := rr.(*dns.CNAME); ok {
				cname = c
			}
		}
		if found || cname == nil {
			break
		}
		m.Answer = append(m.Answer, dns.Copy(cname))
		name = key(cname.Target)
		if seen[name] {
			break
		}
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), opt.Do())
	}
	return m
}
