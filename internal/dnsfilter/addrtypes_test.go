package dnsfilter_test

import (
	"fmt"
	"testing"

	"github.com/miekg/dns"
)

// TestEveryAddressTypeChecked: records of every type that carries an
// address (IPSECKEY gateways, AMTRELAY relays, L32 locators, APL prefixes,
// WKS, A6) are checked like A and AAAA: an internal address refuses the
// answer as dns_rebinding; a public one passes. A6, which cannot be read
// whole, is refused.
func TestEveryAddressTypeChecked(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "*.example.com\n"})
	tests := []struct {
		qtype   uint16
		private string
		public  string // "" when the type is refused whatever it holds
	}{
		{dns.TypeIPSECKEY, "10 1 2 10.0.0.7 AQNRU3mG7TVTO2BkR47usntb102uFJtugbo6BSGvgqt4AQ==", "10 1 2 93.184.215.7 AQNRU3mG7TVTO2BkR47usntb102uFJtugbo6BSGvgqt4AQ=="},
		{dns.TypeIPSECKEY, "10 2 2 fd00::7 AQNRU3mG7TVTO2BkR47usntb102uFJtugbo6BSGvgqt4AQ==", "10 2 2 2606:2800:220:1::7 AQNRU3mG7TVTO2BkR47usntb102uFJtugbo6BSGvgqt4AQ=="},
		{dns.TypeAMTRELAY, "10 0 1 192.168.1.1", "10 0 1 93.184.215.8"},
		{dns.TypeAMTRELAY, "10 0 2 ::1", "10 0 2 2606:2800:220:1::8"},
		// With the discovery bit the relay is not read by miekg/dns: refused.
		{dns.TypeAMTRELAY, "10 1 2 2606:2800:220:1::8", ""},
		{dns.TypeL32, "10 127.0.0.1", "10 93.184.215.9"},
		{dns.TypeAPL, "1:10.0.0.0/8", "1:93.184.215.0/24"},
		{dns.TypeAPL, "1:93.184.215.0/24 2:fd00::/8", ""},
		{11, `\# 5 0a000001 06`, `\# 5 5db8d70a 06`}, // WKS: 10.0.0.1 vs 93.184.215.10, TCP
		{38, `\# 17 00 fd000000000000000000000000000001`, ""},
	}
	for i, tt := range tests {
		tn := dns.TypeToString[tt.qtype]
		if tn == "" {
			tn = fmt.Sprintf("TYPE%d", tt.qtype)
		}
		for _, c := range []struct {
			kind, rdata, want string
		}{{"private", tt.private, "NXDOMAIN"}, {"public", tt.public, "NOERROR"}} {
			if c.rdata == "" {
				continue
			}
			name := fmt.Sprintf("%s%d-%s.example.com", c.kind, i, tn)
			h.up.Add(fmt.Sprintf("%s. 60 IN %s %s", name, tn, c.rdata))
			t.Run(name, func(t *testing.T) {
				r := h.ask(t, name, tt.qtype)
				if rcode(r) != c.want {
					t.Errorf("%s %s: rcode %s answer %v, want %s", tn, c.rdata, rcode(r), r.Answer, c.want)
				}
				if c.want == "NXDOMAIN" {
					if _, text, _ := ede(r); text != "reason=forbidden_address rule=*.example.com" {
						t.Errorf("EDE %q, want reason=forbidden_address (the log keeps dns_rebinding)", text)
					}
				}
			})
		}
	}
}

// TestStrippedRecordsChecked: addresses in records the filter strips
// before answering (another owner in the answer section, an NS glue record,
// an A in the authority section) are checked all the same: an upstream that
// volunteers an internal address for anything is not trusted for the rest.
func TestStrippedRecordsChecked(t *testing.T) {
	h := start(t, harnessOptions{allowlist: "*.example.com\n"})
	for _, tc := range []struct {
		name string
		sec  string
		rr   string
	}{
		{"answer-other-owner.example.com", "answer", "unrelated.example.net. 60 IN A 10.1.2.3"},
		{"answer-other-type.example.com", "answer", "answer-other-type.example.com. 60 IN AAAA fd00::5"},
		{"extra-unreferenced.example.com", "extra", "ns.example.net. 60 IN A 192.168.0.9"},
		{"extra-hint.example.com", "extra", "svc.example.net. 60 IN HTTPS 1 . ipv4hint=127.0.0.1"},
		{"authority-a.example.com", "ns", "ns.example.com. 60 IN A 169.254.169.254"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := tc.name
			h.up.Handle(name, func(req *dns.Msg) *dns.Msg {
				m := new(dns.Msg)
				m.SetReply(req)
				ok, _ := dns.NewRR(name + ". 60 IN A 93.184.215.50")
				bad, err := dns.NewRR(tc.rr)
				if err != nil {
					panic(err)
				}
				m.Answer = []dns.RR{ok}
				switch tc.sec {
				case "answer":
					m.Answer = append(m.Answer, bad)
				case "extra":
					m.Extra = []dns.RR{bad}
				case "ns":
					m.Ns = []dns.RR{bad}
				}
				return m
			})
			r := h.ask(t, name, dns.TypeA)
			if rcode(r) != "NXDOMAIN" || len(r.Answer) != 0 {
				t.Errorf("rcode %s answer %v: an internal address in a stripped %s record went unchecked", rcode(r), r.Answer, tc.sec)
			}
		})
	}
}
