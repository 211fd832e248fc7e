package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCaptureServed: the capture listeners a supervisor hands over are
// served by the instance's proxy (a captured plain request without Host
// is refused there and counted), and the API shows them.
func TestCaptureServed(t *testing.T) {
	var lns [2]net.Listener
	for i := range lns {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns[i] = ln
	}
	p := startPlaneWith(t, DNSConfig{RateLimit: -1}, HTTPConfig{CaptureHTTPListener: lns[0], CaptureTLSListener: lns[1]})
	c, err := net.Dial("tcp", lns[0].Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a listener nothing serves would hang the test
	if b, err := io.ReadAll(c); len(b) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a captured request without Host: %q, %v; want the connection reset", b, err)
	}
	c.Close()
	st, err := p.api.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"capture-80", "capture-443"} {
		if st.Components[name] == nil {
			t.Errorf("API status has no %s: %v", name, st.Components)
		}
	}
	var got struct{ Refused int }
	b, _ := json.Marshal(st.Components["capture-80"])
	json.Unmarshal(b, &got)
	if got.Refused != 1 {
		t.Errorf("capture-80 stats %s, want 1 refused", b)
	}
}

func TestCaptureNeedsBothListeners(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	allow := filepath.Join(t.TempDir(), "allow.txt")
	if err := os.WriteFile(allow, []byte("a.test\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = Run(context.Background(), Config{Instance: "t", AllowlistPath: allow, APISocket: t.TempDir() + "/api.sock",
		HTTP: &HTTPConfig{Listen: "127.0.0.1:0", CADir: t.TempDir(), CaptureHTTPListener: ln}})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "both") {
		t.Errorf("Run with one capture listener = %v, want a configuration error naming both", err)
	}
}
