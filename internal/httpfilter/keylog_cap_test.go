package httpfilter

import (
	"crypto/tls"
	"os"
	"strings"
	"testing"
)

// keyLogSession runs one intercepted TLS session through h to an origin
// and fails the test if the guest's handshake does not complete.
func keyLogSession(t *testing.T, h *harness, target string) {
	t.Helper()
	c := h.connect(t, target)
	defer c.Close()
	if err := tls.Client(c, &tls.Config{RootCAs: h.proxyCA, ServerName: "origin.test"}).Handshake(); err != nil {
		t.Fatalf("a session while the key log is at its cap: %v", err)
	}
}

// TestKeyLogCap: a guest that opens session after session cannot grow
// the key log past its cap: the file stops at a whole line within it, the
// proxy says why (KeyLogStopped, its log), and the sessions go on. A key
// log already at its cap is refused when switched on, naming the fix.
func TestKeyLogCap(t *testing.T) {
	const limit = 2000
	h := newHarness(t, hopts{allow: []string{"origin.test"}, keyLogMax: limit})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	if err := h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		keyLogSession(t, h, "origin.test:"+pt)
	}
	b, err := os.ReadFile(h.keyLog)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > limit || len(b) == 0 {
		t.Fatalf("the key log holds %d bytes after 10 sessions, want some and at most its cap of %d", len(b), limit)
	}
	if !strings.HasSuffix(string(b), "\n") {
		t.Errorf("the key log ends inside a line: %q", b[max(0, len(b)-40):])
	}
	for _, l := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
		if len(strings.Fields(l)) != 3 {
			t.Errorf("key log line %q is not LABEL RANDOM SECRET", l)
		}
	}
	if why := h.p.KeyLogStopped(); !strings.Contains(why, "cap of 2000 bytes") {
		t.Errorf("KeyLogStopped() = %q, want the cap named", why)
	}
	if !strings.Contains(h.diag.String(), "tls key log stopped") {
		t.Errorf("the proxy did not log that the key log stopped:\n%s", h.diag.String())
	}
	// Off clears the stop; on again finds the file near its cap and
	// takes what fits. A file at its cap is refused.
	if err := h.p.SetKeyLog(false); err != nil || h.p.KeyLogStopped() != "" {
		t.Fatalf("SetKeyLog(false) = %v, stopped %q", err, h.p.KeyLogStopped())
	}
	if err := os.WriteFile(h.keyLog, []byte(strings.Repeat("x", limit)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := h.p.SetKeyLog(true); err == nil || !strings.Contains(err.Error(), "delete it") || h.p.KeyLogEnabled() {
		t.Errorf("SetKeyLog(true) on a full key log = %v (on %v), want it refused with the fix", err, h.p.KeyLogEnabled())
	}
}

// TestKeyLogDiskFull: a key log that cannot be written (/dev/full, as a
// full disk answers) stops with the write's error; the guest's sessions
// go on.
func TestKeyLogDiskFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full")
	}
	h := newHarness(t, hopts{allow: []string{"origin.test"}, keyLog: "/dev/full"})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	if err := h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	keyLogSession(t, h, "origin.test:"+pt)
	keyLogSession(t, h, "origin.test:"+pt)
	if why := h.p.KeyLogStopped(); !strings.Contains(why, "no space left on device") {
		t.Errorf("KeyLogStopped() = %q, want the write's error", why)
	}
	h.p.SetKeyLog(false)
}
