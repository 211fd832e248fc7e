package httpfilter

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/decisionlog"
)

// TestDecisionLineMatchesSlog: a record written through decisionlog's
// encoder (Config.Decisions) is byte for byte the line the slog path
// writes, apart from the time stamp, whatever the guest put in the fields.
func TestDecisionLineMatchesSlog(t *testing.T) {
	start := time.Now().Add(-1234567 * time.Microsecond)
	recs := []*record{
		{start: start, kind: "http", client: "10.0.0.2:4242", method: "GET", host: "example.org", port: 80, path: "/a/b",
			status: 200, verdict: allowlist.Allow, reason: "allowlisted", rule: "example.org", up: 12, down: 3456},
		{start: start, kind: "connect", client: "10.0.0.2:1", method: "CONNECT", host: "evil.test", port: 443, status: 403,
			verdict: allowlist.Block, reason: "not_allowlisted", denialID: "3f9c2a7b41d0", mode: "mitm", sni: "x\u2028y"},
		{start: start, kind: "inner", client: "c", method: "G\"E\\T", host: "h\x00\x1f\x7f", port: 8443,
			path: "/\xff\xfe%2e\n\r\t<>&", status: 403, verdict: allowlist.Block, reason: "domain_fronting",
			connect: "a.test:443", asked: "b.test:443", err: errors.New("dial: \"quoted\" \u00e9 \xc3")},
		{start: start, kind: "inner", client: "c", method: "DELETE", host: "api.github.com", port: 443, path: "/repos/a/b",
			status: 403, verdict: allowlist.Block, reason: "method_not_allowed", rule: "api.github.com", ruleSet: "api.github.com",
			denialID: "5b0e9c1f2a77", connect: "api.github.com:443"},
		{start: start, kind: "http", method: "PUT", host: "h.test", port: 80, path: "/t/..;x", status: 200, verdict: allowlist.Allow,
			reason: "allowlisted", rule: "*.h.test", ruleSet: "*.h.test", reqRule: "PUT /t/** audit", wouldDeny: "path_not_canonical",
			detail: "\"/t/..;x\": the segment \"..;x\" is a dot segment \u2028"},
		{start: time.Now(), kind: "http"},
	}
	for i, r := range recs {
		var viaSlog, viaLine bytes.Buffer
		p := &Proxy{dlog: slog.New(slog.NewJSONHandler(&viaSlog, nil))}
		p.stats.blocked = map[string]uint64{}
		p.finish(r)
		w := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{&viaLine}})
		p = &Proxy{dlog: slog.New(slog.DiscardHandler), lines: w}
		p.stats.blocked = map[string]uint64{}
		p.finish(r)
		w.Close()
		a, b := stripTimes(t, viaSlog.String()), stripTimes(t, viaLine.String())
		if a != b {
			t.Errorf("record %d:\nslog: %s\nline: %s", i, a, b)
		}
	}
}

// stripTimes drops the time stamp and the duration, which differ between
// two writes of one record.
func stripTimes(t *testing.T, line string) string {
	t.Helper()
	i := strings.Index(line, `","level":`)
	j := strings.Index(line, `,"duration_ms":`)
	k := strings.Index(line, `,"verdict":`)
	if !strings.HasPrefix(line, `{"time":"`) || i < 0 || j < 0 || k < j {
		t.Fatalf("unexpected line %q", line)
	}
	return line[i:j] + line[k:]
}

// TestDecisionsWriterEndToEnd runs allowed, blocked and intercepted requests
// with Config.Decisions: every request has its line with the documented
// fields.
func TestDecisionsWriterEndToEnd(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}, decisions: true})
	o := newHTTPOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	c := h.client(false)
	for _, u := range []string{"http://origin.test:" + port(t, o) + "/ok?secret=1", "http://blocked.test/x"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	var ok, blocked map[string]any
	for time.Now().Before(deadline) {
		h.lines.Sync()
		ok, blocked = h.lastLog("host", "origin.test"), h.lastLog("host", "blocked.test")
		if ok != nil && blocked != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ok == nil || blocked == nil {
		t.Fatalf("missing lines: ok %v blocked %v", ok, blocked)
	}
	for k, v := range map[string]any{"msg": "request", "level": "INFO", "kind": "http", "method": "GET", "path": "/ok",
		"status": float64(200), "verdict": "allow", "reason": "allowlisted"} {
		if ok[k] != v {
			t.Errorf("allowed line: %s = %v, want %v (%v)", k, ok[k], v, ok)
		}
	}
	if blocked["status"] != float64(403) || blocked["reason"] != "not_allowlisted" || blocked["denial_id"] == nil {
		t.Errorf("blocked line: %v", blocked)
	}
}

// TestHealthcheckFloodFolded: a guest's flood of healthcheck requests with
// 8 KiB paths (answered by the proxy, reaching nothing) writes a few short
// lines, not one long line each: before the fold a guest replaced http.log
// and its backups in about a minute. Paths are cut at maxLoggedPath.
func TestHealthcheckFloodFolded(t *testing.T) {
	h := newHarness(t, hopts{allow: []string{"origin.test"}, decisions: true})
	o := newHTTPOrigin(t, originMux())
	h.allowOrigin("origin.test", o, port(t, o))
	c := h.client(false)
	long := "/" + strings.Repeat("a", 8<<10-100) // just under the request-line cap
	const n = 300
	for i := range n {
		u := "http://healthcheck.abox.local" + long
		if i == n-1 {
			u = "http://origin.test:" + port(t, o) + long
		}
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitFor(t, func() bool { h.lines.Sync(); return h.lastLog("host", "origin.test") != nil }, "the allowed request's line")
	var health, size int
	var origin map[string]any
	for _, l := range h.log.lines() {
		if l["reason"] == "healthcheck" {
			health++
		}
		if l["host"] == "origin.test" {
			origin = l
		}
	}
	size = len(h.log.String())
	// The budget is per second: a slow run may span a few windows.
	if health == 0 || health > 4*decisionlog.DefaultLocalPerClient {
		t.Errorf("%d healthcheck lines for %d requests, want at most a few budgets of %d", health, n-1, decisionlog.DefaultLocalPerClient)
	}
	if size > 64<<10 {
		t.Errorf("%d bytes of log for %d healthchecks", size, n-1)
	}
	if origin == nil {
		t.Fatalf("the allowed request after the flood has no line")
	}
	if p, _ := origin["path"].(string); len(p) > maxLoggedPath+len("…") || !strings.HasSuffix(p, "…") {
		t.Errorf("logged path of %d bytes, want it cut at %d and marked", len(p), maxLoggedPath)
	}
}
