package egress

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/netclass"
)

// parent is a real CONNECT proxy on loopback that records every request
// and tunnels the ones it accepts.
type parent struct {
	ln       net.Listener
	mu       sync.Mutex
	requests []*http.Request
	status   int
}

func startParent(t *testing.T, status int) *parent {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &parent{ln: ln, status: status}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *parent) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	p.mu.Lock()
	p.requests = append(p.requests, req)
	p.mu.Unlock()
	if p.status != http.StatusOK {
		io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(p.status)+" "+http.StatusText(p.status)+"\r\nContent-Length: 0\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", req.Host)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go io.Copy(up, br)
	io.Copy(c, up)
}

func (p *parent) seen() []*http.Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*http.Request(nil), p.requests...)
}

type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, h string) ([]netip.Addr, error) { return m[h], nil }

// TestParentProxyGetsOnlyCheckedAddresses: with a parent proxy as the
// Guard's dialer, a refused destination never reaches the parent, and an
// allowed one is asked for by its checked address with the credentials
// from the file.
func TestParentProxyGetsOnlyCheckedAddresses(t *testing.T) {
	origin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer origin.Close()
	go func() {
		for {
			c, err := origin.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	originPort := origin.Addr().(*net.TCPAddr).Port
	par := startParent(t, http.StatusOK)
	cred := filepath.Join(t.TempDir(), "cred")
	os.WriteFile(cred, []byte("alice:s3cret\n"), 0o600)
	pp, err := NewParentProxy("http://"+par.ln.Addr().String(), cred)
	if err != nil {
		t.Fatal(err)
	}
	g := &Guard{
		Resolver: mapResolver{
			"allowed.test":   {netip.MustParseAddr("127.0.0.1")},
			"rebinding.test": {netip.MustParseAddr("10.0.0.5")},
		},
		// Loopback stands in for a public origin here; 10.0.0.0/8 stays refused.
		Policy: netclass.New(netclass.Options{PermitHost: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}),
		Dialer: pp,
	}
	ctx := context.Background()
	for _, name := range []string{"rebinding.test", "unknown.test"} {
		if c, r := g.Check(ctx, Target{Name: name, Port: uint16(originPort)}); r == nil {
			g.Dial(ctx, c)
			t.Errorf("%s passed the check", name)
		}
	}
	if _, r := g.Check(ctx, Target{Addr: netip.MustParseAddr("169.254.169.254"), Port: 80}); r == nil {
		t.Error("the metadata address passed the check")
	}
	if n := len(par.seen()); n != 0 {
		t.Fatalf("refused destinations reached the parent: %d requests", n)
	}
	c, r := g.Check(ctx, Target{Name: "allowed.test", Port: uint16(originPort)})
	if r != nil {
		t.Fatal(r)
	}
	conn, err := g.Dial(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "ping\n")
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Errorf("through the parent: %q, %v", line, err)
	}
	seen := par.seen()
	want := "127.0.0.1:" + strconv.Itoa(originPort)
	if len(seen) != 1 || seen[0].Method != http.MethodConnect || seen[0].Host != want {
		t.Fatalf("parent saw %v, want one CONNECT %s", seen, want)
	}
	if got := seen[0].Header.Get("Proxy-Authorization"); got != "Basic "+base64.StdEncoding.EncodeToString([]byte("alice:s3cret")) {
		t.Errorf("Proxy-Authorization = %q", got)
	}
	// A name handed to the dialer directly is refused, not resolved by
	// the parent.
	if _, err := pp.DialContext(ctx, "tcp", "allowed.test:443"); err == nil {
		t.Error("the parent dialer took a name")
	}
	if n := len(par.seen()); n != 1 {
		t.Errorf("a name was sent to the parent (%d requests)", n)
	}
}

func TestParentProxyRefusals(t *testing.T) {
	par := startParent(t, http.StatusProxyAuthRequired)
	pp, err := NewParentProxy("http://"+par.ln.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = pp.DialContext(context.Background(), "tcp", "127.0.0.1:443")
	if err == nil || !strings.Contains(err.Error(), "407") || !strings.Contains(err.Error(), "credentials file") {
		t.Errorf("407: %v", err)
	}
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("no-colon\n"), 0o600)
	// One line USER:PASSWORD, but far longer than any credentials: an
	// abox.yaml's credentials_file may name any host file.
	huge := filepath.Join(dir, "huge")
	os.WriteFile(huge, []byte("u:"+strings.Repeat("p", MaxCredentialsBytes)+"\n"), 0o600)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ url, cred, want string }{
		{"http://u:p@proxy:3128", "", "do not belong in the URL"},
		{"https://proxy:3128", "", "want http://HOST:PORT"},
		{"http://proxy", "", "want http://HOST:PORT"},
		// What an imported archive could carry into status output.
		{"http://proxy\u202eexample:3128", "", "HOST an IP address or a DNS name"},
		{"http://proxy\u009b31m:3128", "", "HOST an IP address or a DNS name"},
		{"http://proxy:99999", "", "PORT 1-65535"},
		{"http://proxy:3128", filepath.Join(dir, "missing"), "credentials"},
		{"http://proxy:3128", bad, "USER:PASSWORD"},
		{"http://proxy:3128", huge, "over 4096 bytes"},
		{"http://proxy:3128", fifo, "not a regular file"},
		{"http://proxy:3128", dir, "not a regular file"},
	} {
		// A FIFO nobody writes to must fail at once, not hang.
		done := make(chan error, 1)
		go func() { _, err := NewParentProxy(tc.url, tc.cred); done <- err }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewParentProxy(%q, %q) = %v, want %q", tc.url, tc.cred, err, tc.want)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("NewParentProxy(%q, %q) still reading after 10s", tc.url, tc.cred)
		}
	}
}
