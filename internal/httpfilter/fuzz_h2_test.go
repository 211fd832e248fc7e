package httpfilter

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/abox-dev/abox/internal/egress"
)

// FuzzInnerH2: the HTTP/2 frames a guest sends inside an intercepted
// tunnel, served by the proxy's HTTP/2 server and handler as intercept
// serves them once TLS is done (the TLS layer itself is left out: the
// frames are what the guest chooses). Every request an origin reads is one
// the proxy allowed for the tunnel's own target and names exactly that
// host (FuzzProxyH1's checks); the tunnel here carries plain HTTP, so that
// the in-memory origins need no TLS.
func FuzzInnerH2(f *testing.F) {
	for _, b := range h2Seeds(f) {
		f.Add(b)
	}
	fp := newFuzzProxy(f, false)
	f.Fuzz(func(t *testing.T, b []byte) {
		fp.serveH2(t, append([]byte(http2.ClientPreface), b...), -1)
	})
}

// serveH2 serves b as the plaintext of an intercepted HTTP/2 connection
// in a tunnel to h2Target, checks what reached the origins and returns it.
//
// The guest holds the connection open once its frames are read, so that
// the streams they opened are served, until the handlers are done: want ≥ 0
// waits (up to 20 s) until want requests have reached the origins and no
// handler runs; want < 0 waits up to 10 ms for all of them, as some wait
// for frames that will not come (an in-memory exchange takes less; one cut
// short costs coverage, not truth, and waiting 200 ms made the fuzzer run
// a few inputs a second). A handler that starts after that is not run: what the
// origins read is then this connection's alone, however the goroutines
// were scheduled.
func (fp *fuzzProxy) serveH2(t *testing.T, b []byte, want int) []originReq {
	target := egress.Target{Name: h2Target, Port: 80}
	ctx := context.Background()
	d := fp.p.decide(ctx, target, nil, nil)
	if d.checked == nil {
		t.Fatalf("%s is not allowed: %s", h2Target, d.reason)
	}
	sc := &scope{connect: target, authority: target.Authority(), checked: d.checked, scheme: "http", defaultPort: 80}
	c := &h2Guest{fuzzConn: newFuzzConn(b), goaway: make(chan struct{})}
	c.hold = true
	var (
		mu               sync.Mutex
		over             bool
		active, finished atomic.Int32
	)
	served := make(chan struct{})
	go func() {
		defer close(served)
		fp.p.h2.ServeConn(c, &http2.ServeConnOpts{
			Context: context.WithValue(context.WithValue(ctx, connKey{}, nil), scopeKey{}, sc),
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				if over {
					mu.Unlock()
					return
				}
				active.Add(1)
				mu.Unlock()
				defer active.Add(-1)
				defer finished.Add(1)
				fp.p.serveInnerH2(w, r)
			}),
			BaseConfig: fp.p.inner,
		})
	}()
	select {
	case <-c.drained:
	case <-served:
	case <-c.goaway: // the server reads no more frames
	}
	// The handlers of the streams read are started by now, though maybe
	// not running yet: give them a millisecond to show up.
	// A caller that names the count waits for it for as long as a loaded
	// machine may need (the test then fails on the count, not the clock).
	start, limit := time.Now(), 10*time.Millisecond
	if want >= 0 {
		limit = 20 * time.Second
	}
	for time.Since(start) < limit {
		time.Sleep(100 * time.Microsecond)
		if want >= 0 && fp.origins.count() >= want && active.Load() == 0 ||
			want < 0 && active.Load() == 0 && (finished.Load() > 0 || time.Since(start) > time.Millisecond) {
			break
		}
	}
	c.Close()
	mu.Lock()
	over = true
	mu.Unlock()
	select {
	case <-served:
	case <-c.goaway:
		// After a connection error x/net's server sends GOAWAY and
		// closes the connection only when its goAwayTimeout (1 s) ends,
		// whatever the guest does: waiting for it held every such input
		// for a second (about 10 inputs a second). With over set it
		// starts no handler meanwhile, and the guest is gone, so what it
		// still does reaches no origin. (A handler still reading a body
		// when the error came is waited for below: x/net ends its stream
		// only at that timeout, so such an input still costs a second.)
	}
	for deadline := time.Now().Add(20 * time.Second); active.Load() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a handler still runs after the guest that sent %q left", b)
		}
	}
	_, reqs, lines := fp.collect(t, b)
	fp.checkRequests(t, b, reqs, lines)
	return reqs
}

// h2Guest is the guest's side of an HTTP/2 connection: a fuzzConn that
// also reads the frame headers of what the server writes, and closes
// goaway at its GOAWAY, after which the server reads no more frames.
type h2Guest struct {
	*fuzzConn
	mu     sync.Mutex
	out    []byte // the server's bytes not yet a whole frame
	once   sync.Once
	goaway chan struct{}
}

func (g *h2Guest) Write(b []byte) (int, error) {
	n, err := g.fuzzConn.Write(b)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.out = append(g.out, b[:n]...)
	for len(g.out) >= 9 {
		size := 9 + (int(g.out[0])<<16 | int(g.out[1])<<8 | int(g.out[2]))
		if len(g.out) < size {
			break
		}
		if http2.FrameType(g.out[3]) == http2.FrameGoAway {
			g.once.Do(func() { close(g.goaway) })
		}
		g.out = g.out[size:]
	}
	return n, err
}

const h2Target = "allowed.test"

// h2Seeds are frame sequences (after the client preface): requests for
// the tunnel's host and for others, with bodies, several streams, a Host
// field beside :authority, a CONNECT and routing fields.
func h2Seeds(t testing.TB) [][]byte {
	frames := func(streams ...[][2]string) []byte {
		var buf bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		fr.WriteSettings()
		for i, fields := range streams {
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			body := ""
			for _, kv := range fields {
				if kv[0] == "body" {
					body = kv[1]
					continue
				}
				enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
			}
			id := uint32(2*i + 1)
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: body == ""}); err != nil {
				t.Fatal(err)
			}
			if body != "" {
				fr.WriteData(id, true, []byte(body))
			}
		}
		return buf.Bytes()
	}
	get := func(authority string, extra ...[2]string) [][2]string {
		return append([][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", authority}, {":path", "/"}}, extra...)
	}
	req := func(method, path string) [][2]string {
		return [][2]string{{":method", method}, {":scheme", "http"}, {":authority", h2Target}, {":path", path}}
	}
	return [][]byte{
		frames(get(h2Target)),
		frames(get("evil.test")),
		frames(get(h2Target), get("x.ok.test"), get(h2Target+":80")),
		frames(get(h2Target, [2]string{"host", "evil.test"})),
		frames([][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", h2Target}, {":path", "/up"}, {"content-length", "5"}, {"body", "hello"}}),
		frames([][2]string{{":method", "CONNECT"}, {":authority", "evil.test:443"}}),
		frames([][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}, {"host", h2Target}}),
		frames(get(h2Target, [2]string{"forwarded", "host=evil.test"}, [2]string{"x-forwarded-host", "evil.test"}, [2]string{"x-host", "evil.test"})),
		frames([][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", h2Target}, {":path", "http:https://evil.test/"}}),
		frames([][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", h2Target}, {":path", "http://evil.test/"}}),
		// Request rules (fuzzAllowlist): a refused stream beside allowed
		// ones, escapes of a rule, spellings sent in canonical form.
		frames(req("DELETE", "/x"), get(h2Target), req("POST", "/up/%2e%2e/x"), req("POST", "/x/%2E%2E/up")),
		frames(req("GET", "/a/..;/b"), req("GET", "//a/./b%2fc"), req("PUT", "/trial/%2e/f"), req("PUT", "/f")),
	}
}

// TestFuzzInnerH2ReachesOrigins: the HTTP/2 harness really forwards: the
// seeds' requests for the tunnel's host reach the origin, the others not.
func TestFuzzInnerH2ReachesOrigins(t *testing.T) {
	fp := newFuzzProxy(t, false)
	want := []int{1, 0, 2, 0, 1, 0, 1, 1, 0, 0, 2, 2}
	for i, b := range h2Seeds(t) {
		if reqs := fp.serveH2(t, append([]byte(http2.ClientPreface), b...), want[i]); len(reqs) != want[i] {
			t.Errorf("seed %d: %d requests reached an origin, want %d: %+v", i, len(reqs), want[i], reqs)
		}
	}
}
