package httpfilter

import (
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/testutil/fakedns"
	"github.com/abox-dev/abox/internal/upstream"
)

// TestAliasIntoLocalNameRefused: an allowlisted name that the upstream
// resolves through a CNAME into a single-label, special-use or numeric name
// or a private reverse name
// is refused before any dial, over plain HTTP and CONNECT, even when only
// one address family is aliased; an alias into an ordinary name works.
func TestAliasIntoLocalNameRefused(t *testing.T) {
	dns := fakedns.StartT(t)
	dns.Add(
		"origin.test. 60 IN A 127.0.0.1",
		"ok.allowed.test. 60 IN CNAME origin.test.",
		"mdns.allowed.test. 60 IN CNAME printer.local.",
		"printer.local. 60 IN A 127.0.0.1",
		"single.allowed.test. 60 IN CNAME hop.example.net.",
		"hop.example.net. 60 IN CNAME gw.",
		"gw. 60 IN A 127.0.0.1",
		"numeric.allowed.test. 60 IN CNAME 127.0.0.1.",
		"127.0.0.1. 60 IN A 127.0.0.1",
		// A answered directly, AAAA through an alias into .internal.
		"v6.allowed.test. 60 IN A 127.0.0.1",
		"v6.allowed.test. 60 IN CNAME db.internal.",
		"db.internal. 60 IN AAAA ::1",
		"rev.allowed.test. 60 IN CNAME 1.0.0.127.in-addr.arpa.",
		"1.0.0.127.in-addr.arpa. 60 IN A 127.0.0.1",
	)
	up, err := upstream.New(upstream.Config{Servers: []string{dns.Addr}, Timeout: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := &recordingDialer{}
	h := newHarness(t, hopts{allow: []string{"*.allowed.test"}, resolver: up, dialer: d, permit: []string{"127.0.0.1/32", "::1/128"}})
	o := newHTTPOrigin(t, originMux())
	pt := port(t, o)
	h.p.ports[uint16(mustAtoi(pt))] = true
	for _, name := range []string{"mdns.allowed.test", "single.allowed.test", "numeric.allowed.test", "v6.allowed.test", "rev.allowed.test"} {
		t.Run(name, func(t *testing.T) {
			resp, body := h.rawRequest(t, "GET http://"+name+":"+pt+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n")
			h.checkNameRefusal(t, resp, body, allowlist.ReasonSpecialUseAlias, name)
			resp, body = h.rawRequest(t, "CONNECT "+name+":"+pt+" HTTP/1.1\r\n\r\n")
			h.checkNameRefusal(t, resp, body, allowlist.ReasonSpecialUseAlias, name)
		})
	}
	if got := d.dialed(); len(got) != 0 {
		t.Errorf("dialled %v for names aliased into local names", got)
	}
	resp, body := h.rawRequest(t, "GET http://ok.allowed.test:"+pt+"/ HTTP/1.1\r\nHost: ok.allowed.test\r\n\r\n")
	if resp.StatusCode != 200 {
		t.Errorf("alias into an ordinary name: status %d %q", resp.StatusCode, body)
	}
}
