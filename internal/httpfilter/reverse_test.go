package httpfilter

import (
	"testing"

	"github.com/abox-dev/abox/internal/policy"
)

// TestPrivateReverseNamesRefused: the proxy refuses reverse-mapping names of
// private ranges (and partial ones) as the DNS filter does, before any
// lookup, over plain HTTP and CONNECT, even when the allowlist has an entry
// such as *.10.in-addr.arpa and in passive mode: a lookup of such a name
// would put a question about the host's network to the host's resolvers.
func TestPrivateReverseNamesRefused(t *testing.T) {
	for _, passive := range []bool{false, true} {
		d := &recordingDialer{}
		h := newHarness(t, hopts{allow: []string{"*.10.in-addr.arpa", "*.168.192.in-addr.arpa"}, passive: passive, dialer: d})
		for _, name := range []string{"5.0.0.10.in-addr.arpa", "1.1.168.192.in-addr.arpa", "0.10.in-addr.arpa", "a.b.168.192.in-addr.arpa"} {
			h.res.set(name, "127.0.0.1")
			resp, body := h.rawRequest(t, "GET http://"+name+"/ HTTP/1.1\r\nHost: "+name+"\r\n\r\n")
			checkRefusal(t, resp, body, 403, policy.ReasonPrivateReverse, name)
			resp, body = h.rawRequest(t, "CONNECT "+name+":443 HTTP/1.1\r\n\r\n")
			checkRefusal(t, resp, body, 403, policy.ReasonPrivateReverse, name)
			if n := h.res.count(name); n != 0 {
				t.Errorf("passive=%v: %s was looked up %d times", passive, name, n)
			}
		}
		if got := d.dialed(); len(got) != 0 {
			t.Errorf("passive=%v: dialled %v", passive, got)
		}
	}
}
