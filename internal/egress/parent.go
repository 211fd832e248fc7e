package egress

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ParentProxy is a Dialer that reaches every destination through an HTTP
// parent proxy (CONNECT), for hosts that may only reach the internet
// through one. It is given to the Guard as its Dialer, so it only ever
// sees addresses the Guard checked: the allowlist, the port policy and the
// address classes have decided before anything is sent to the parent, and
// the parent is asked for the checked address itself (CONNECT
// 203.0.113.7:443), never a name it would resolve on its own.
type ParentProxy struct {
	// Addr is the parent's HOST:PORT. It is the user's own setting and is
	// dialled as given (corporate proxies live on private addresses).
	Addr string
	// auth is the Proxy-Authorization value, or empty.
	auth string
	// Dialer reaches the parent; nil means a net.Dialer.
	Dialer Dialer
	// Timeout bounds the CONNECT exchange; 0 means 15s.
	Timeout time.Duration
}

// NewParentProxy parses an http://HOST:PORT URL (credentials in it are
// refused: they would show in process lists and configs) and reads
// USER:PASSWORD from credentialsFile when it is set.
func NewParentProxy(rawURL, credentialsFile string) (*ParentProxy, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.Host == "" || u.Port() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("upstream proxy %q: want http://HOST:PORT", rawURL)
	}
	if u.User != nil {
		return nil, errors.New("upstream proxy: credentials do not belong in the URL; put USER:PASSWORD in a file and name it as the credentials file")
	}
	// HOST is an IP or an ASCII DNS name: the URL reaches status output
	// and may come from an imported archive, and url.Parse lets Unicode
	// format characters (a right-to-left override) through.
	if port, err := strconv.ParseUint(u.Port(), 10, 16); err != nil || port == 0 || !proxyHostOK(u.Hostname()) {
		return nil, fmt.Errorf("upstream proxy %q: want http://HOST:PORT with HOST an IP address or a DNS name and PORT 1-65535", rawURL)
	}
	p := &ParentProxy{Addr: u.Host}
	if credentialsFile != "" {
		b, err := readCredentials(credentialsFile)
		if err != nil {
			return nil, fmt.Errorf("upstream proxy credentials: %w", err)
		}
		cred := strings.TrimRight(string(b), "\r\n")
		if i := strings.IndexByte(cred, ':'); i <= 0 || strings.ContainsAny(cred, "\r\n") {
			return nil, fmt.Errorf("upstream proxy credentials %s: want one line USER:PASSWORD", credentialsFile)
		}
		p.auth = "Basic " + base64.StdEncoding.EncodeToString([]byte(cred))
	}
	return p, nil
}

// MaxCredentialsBytes bounds the credentials file: one USER:PASSWORD line.
const MaxCredentialsBytes = 4096

// readCredentials reads the credentials file, a regular file of at most
// MaxCredentialsBytes: the path comes from abox.yaml or a flag, and a
// device (/dev/zero) or a FIFO must fail at once, not fill memory or hang.
func readCredentials(path string) ([]byte, error) {
	fh, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	if fi, err := fh.Stat(); err != nil {
		return nil, err
	} else if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file: put USER:PASSWORD on one line in a file", path)
	}
	b, err := io.ReadAll(io.LimitReader(fh, MaxCredentialsBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxCredentialsBytes {
		return nil, fmt.Errorf("%s is over %d bytes: want one line USER:PASSWORD", path, MaxCredentialsBytes)
	}
	return b, nil
}

// DialContext implements Dialer: address must be an IP:PORT (what the
// Guard dials); a name is refused rather than handed to the parent.
func (p *ParentProxy) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if network != "tcp" {
		return nil, fmt.Errorf("upstream proxy: %s is not tcp", network)
	}
	if _, err := netip.ParseAddrPort(address); err != nil {
		return nil, fmt.Errorf("upstream proxy: %q is not a checked address", address)
	}
	d := p.Dialer
	if d == nil {
		d = &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	}
	conn, err := d.DialContext(ctx, "tcp", p.Addr)
	if err != nil {
		return nil, fmt.Errorf("upstream proxy %s: %w", p.Addr, err)
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = 15 * time.Second
	}
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	conn.SetDeadline(deadline)
	req := "CONNECT " + address + " HTTP/1.1\r\nHost: " + address + "\r\n"
	if p.auth != "" {
		req += "Proxy-Authorization: " + p.auth + "\r\n"
	}
	if _, err := conn.Write([]byte(req + "\r\n")); err != nil {
		conn.Close()
		return nil, fmt.Errorf("upstream proxy %s: %w", p.Addr, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("upstream proxy %s: reading its answer to CONNECT %s: %w", p.Addr, address, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		conn.Close()
		hint := ""
		if resp.StatusCode == http.StatusProxyAuthRequired {
			hint = " (check the credentials file)"
		}
		return nil, fmt.Errorf("upstream proxy %s refused CONNECT %s: %s%s", p.Addr, address, resp.Status, hint)
	}
	conn.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// bufferedConn keeps bytes the parent sent right after its 200.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// proxyHostOK reports whether h is an IP address or a DNS name of ASCII
// letters, digits and hyphens.
func proxyHostOK(h string) bool {
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}
