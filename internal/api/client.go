package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/policy"
)

// Client talks to one instance's API socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Error is an error answered by the server.
type Error struct {
	Status int
	ErrorBody
}

func (e *Error) Error() string { return e.ErrorBody.Error }

// ErrNotRunning means nothing listens on the socket.
var ErrNotRunning = errors.New("the instance's filters are not running")

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://abox"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w (no api socket at %s)", ErrNotRunning, c.socket)
		}
		return fmt.Errorf("calling the instance api: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading api response: %w", err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		if json.Unmarshal(data, &e.ErrorBody) != nil || e.ErrorBody.Error == "" {
			e.ErrorBody.Error = fmt.Sprintf("api answered %s", resp.Status)
		}
		return e
	}
	if raw, ok := out.(*[]byte); ok {
		*raw = data
		return nil
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("decoding api response: %w", err)
		}
	}
	return nil
}

func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.do(ctx, http.MethodGet, "/v1/status", nil, &s)
}

func (c *Client) Mode(ctx context.Context) (policy.Mode, error) {
	var b ModeBody
	err := c.do(ctx, http.MethodGet, "/v1/mode", nil, &b)
	return b.Mode, err
}

func (c *Client) SetMode(ctx context.Context, m policy.Mode) error {
	return c.do(ctx, http.MethodPut, "/v1/mode", ModeBody{Mode: m}, nil)
}

func (c *Client) Reload(ctx context.Context) (policy.ReloadStatus, error) {
	var s policy.ReloadStatus
	return s, c.do(ctx, http.MethodPost, "/v1/reload", nil, &s)
}

// Allowlist returns the list in force: its names, and its lines.
func (c *Client) Allowlist(ctx context.Context) (EntriesBody, error) {
	var b EntriesBody
	return b, c.do(ctx, http.MethodGet, "/v1/allowlist", nil, &b)
}

// AllowlistText returns the allowlist text in force.
func (c *Client) AllowlistText(ctx context.Context) (TextBody, error) {
	var b TextBody
	return b, c.do(ctx, http.MethodGet, "/v1/allowlist/text", nil, &b)
}

// ReplaceAllowlist puts text in force if the text in force is still expected.
func (c *Client) ReplaceAllowlist(ctx context.Context, expected, text string) (policy.ReloadStatus, error) {
	var s policy.ReloadStatus
	return s, c.do(ctx, http.MethodPut, "/v1/allowlist/text", TextBody{Text: text, Expected: expected}, &s)
}

// AllowlistAdd adds allowlist lines (names, or a name and one rule) and
// returns those that were not yet listed.
func (c *Client) AllowlistAdd(ctx context.Context, entries []string) ([]string, error) {
	var b EntriesBody
	err := c.do(ctx, http.MethodPost, "/v1/allowlist/add", EntriesBody{Entries: entries}, &b)
	return b.Entries, err
}

// AllowlistRemove removes allowlist lines: a name with all its rules, a
// rule line just that rule. Gone names the entries whose last rule went.
func (c *Client) AllowlistRemove(ctx context.Context, entries []string) (EntriesBody, error) {
	var b EntriesBody
	err := c.do(ctx, http.MethodPost, "/v1/allowlist/remove", EntriesBody{Entries: entries}, &b)
	return b, err
}

func (c *Client) Profile(ctx context.Context) (policy.ProfileSnapshot, error) {
	var p policy.ProfileSnapshot
	return p, c.do(ctx, http.MethodGet, "/v1/profile", nil, &p)
}

func (c *Client) ClearProfile(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/v1/profile", nil, nil)
}

// Logs returns the last n lines (since == 0) or the lines after since.
func (c *Client) Logs(ctx context.Context, component string, n int, since uint64) (LogsBody, error) {
	q := url.Values{}
	if since > 0 {
		q.Set("since", strconv.FormatUint(since, 10))
	} else {
		q.Set("n", strconv.Itoa(n))
	}
	var b LogsBody
	return b, c.do(ctx, http.MethodGet, "/v1/logs/"+url.PathEscape(component)+"?"+q.Encode(), nil, &b)
}

// Metrics returns the filters' Prometheus metrics in the text exposition
// format.
func (c *Client) Metrics(ctx context.Context) ([]byte, error) {
	var b []byte
	return b, c.do(ctx, http.MethodGet, "/metrics", nil, &b)
}

func (c *Client) KeyLog(ctx context.Context) (KeyLogStatus, error) {
	var k KeyLogStatus
	return k, c.do(ctx, http.MethodGet, "/v1/keylog", nil, &k)
}

func (c *Client) SetKeyLog(ctx context.Context, enabled bool) (KeyLogStatus, error) {
	var k KeyLogStatus
	return k, c.do(ctx, http.MethodPut, "/v1/keylog", KeyLogStatus{Enabled: enabled}, &k)
}

// KeyLogSecretSessions opts the key log, which must be on, into the keys
// of sessions that carried an injected secret until it is switched off.
func (c *Client) KeyLogSecretSessions(ctx context.Context) (KeyLogStatus, error) {
	var k KeyLogStatus
	return k, c.do(ctx, http.MethodPut, "/v1/keylog", KeyLogStatus{Enabled: true, SecretSessions: true}, &k)
}
