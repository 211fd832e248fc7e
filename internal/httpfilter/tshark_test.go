package httpfilter

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestKeyLogDecryptsCapture captures an intercepted session on loopback
// with tshark and decrypts it with the proxy's key log: the inner request
// path, invisible on the wire, appears in the decoded capture.
func TestKeyLogDecryptsCapture(t *testing.T) {
	if _, err := exec.LookPath("tshark"); err != nil {
		t.Skip("tshark not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("capturing on loopback needs root")
	}
	h := newHarness(t, hopts{allow: []string{"origin.test"}})
	so := newHTTPSOrigin(t, originMux())
	pt := port(t, so)
	h.allowOrigin("origin.test", so, pt)
	if err := h.p.SetKeyLog(true); err != nil {
		t.Fatal(err)
	}
	proxyPort := h.addr[strings.LastIndexByte(h.addr, ':')+1:]
	// dumpcap says it captures before its socket sees traffic, and may
	// stop before it wrote the last packets: a capture that lacks the
	// connection's SYN or FIN is taken again, with longer waits, rather
	// than judged (a fixed wait is outlasted on a loaded machine).
	var pcap string
	for attempt := 1; ; attempt++ {
		pcap = filepath.Join(t.TempDir(), "capture.pcap")
		if d := os.Getenv("ABOX_KEEP_PCAP"); d != "" {
			pcap = d
		}
		captureOnce(t, h, pt, proxyPort, pcap, time.Duration(attempt)*time.Second)
		out, err := exec.Command("tshark", "-r", pcap, "-Y", "tcp.flags.syn==1 && tcp.flags.ack==0 || tcp.flags.fin==1", "-T", "fields", "-e", "tcp.flags.fin").Output()
		if err != nil {
			t.Fatalf("tshark -r: %v", err)
		}
		flags := strings.Fields(string(out))
		syn, fin := 0, 0
		for _, f := range flags {
			switch f {
			case "0", "False":
				syn++
			default:
				fin++
			}
		}
		if syn > 0 && fin > 0 {
			break
		}
		if attempt == 3 {
			t.Skipf("tshark missed the connection's start or end in 3 captures (SYN %d, FIN %d)", syn, fin)
		}
		t.Logf("capture %d incomplete (SYN %d, FIN %d); again", attempt, syn, fin)
	}

	decode := func(keylog string) string {
		args := []string{"-r", pcap, "-d", "tcp.port==" + proxyPort + ",http", "-Y", "http.request", "-T", "fields", "-e", "http.request.uri"}
		if keylog != "" {
			args = append([]string{"-o", "tls.keylog_file:" + keylog}, args...)
		}
		out, err := exec.Command("tshark", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tshark -r: %v\n%s", err, out)
		}
		return string(out)
	}
	if got := decode(""); strings.Contains(got, "/very-secret-path") {
		t.Fatalf("the inner path is readable without keys: %s", got)
	}
	if got := decode(h.keyLog); !strings.Contains(got, "/very-secret-path") {
		t.Errorf("decrypted capture lacks the inner request; tshark printed:\n%s", got)
	}
}

// captureOnce runs tshark on loopback while one intercepted request goes
// through the proxy, waiting settle after tshark starts and after the
// connection closes.
func captureOnce(t *testing.T, h *harness, pt, proxyPort, pcap string, settle time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	capture := exec.CommandContext(ctx, "tshark", "-i", "lo", "-f", "tcp port "+proxyPort, "-w", pcap)
	stderr, _ := capture.StderrPipe()
	if err := capture.Start(); err != nil {
		t.Skipf("starting tshark: %v", err)
	}
	started := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "Capturing on") {
				started <- true
			}
		}
		io.Copy(io.Discard, stderr)
	}()
	select {
	case <-started:
		// dumpcap reports before its socket sees traffic; give it a moment.
		time.Sleep(settle)
	case <-time.After(15 * time.Second):
		capture.Process.Kill()
		capture.Wait()
		t.Skip("tshark did not start capturing")
	}
	c := h.client(false)
	resp, err := c.Get("https://origin.test:" + pt + "/very-secret-path")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.Transport.(*http.Transport).CloseIdleConnections()
	time.Sleep(settle / 2)
	capture.Process.Signal(os.Interrupt)
	capture.Wait()
}
