package tap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/testutil/need"
)

func TestArgs(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		want []string
	}{
		{"live, ssh left out", Options{Bridge: "abx0"}, []string{"-i", "abx0", "-n", "--immediate-mode", "-l", "not (tcp port 22)"}},
		{"file and count", Options{Bridge: "abx0", Write: "/x.pcap", Count: 5}, []string{"-i", "abx0", "-n", "--immediate-mode", "-U", "-w", "-", "-c", "5", "not (tcp port 22)"}},
		{"filter is parenthesised", Options{Bridge: "abx0", Filter: "udp or icmp"}, []string{"-i", "abx0", "-n", "--immediate-mode", "-l", "(udp or icmp) and not (tcp port 22)"}},
		{"include ssh", Options{Bridge: "abx0", IncludeSSH: true}, []string{"-i", "abx0", "-n", "--immediate-mode", "-l"}},
		{"extra before the filter", Options{Bridge: "abx0", IncludeSSH: true, Filter: "icmp", Extra: []string{"-vv"}}, []string{"-i", "abx0", "-n", "--immediate-mode", "-l", "-vv", "(icmp)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.o.Args()
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("Args() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	ringOK := Options{Bridge: "abx0", Write: "/x.pcap", MaxBytes: minRingBytes, Ring: 2}
	if _, err := ringOK.Args(); err != nil {
		t.Errorf("Args(%+v): %v", ringOK, err)
	}
	for _, bad := range []Options{{Bridge: "br0; rm -rf /"}, {Bridge: ""}, {Bridge: "abx0", Count: -1},
		{Bridge: "abx0", Write: "/x.pcap", MaxBytes: -1}, {Bridge: "abx0", Write: "/x.pcap", MaxBytes: pcapHeaderLen},
		{Bridge: "abx0", Write: "/x.pcap", MaxBytes: minRingBytes, Ring: 1},
		{Bridge: "abx0", Write: "/x.pcap", MaxBytes: minRingBytes - 1, Ring: 2},
		{Bridge: "abx0", Write: "/x.pcap", Ring: 2},
		{Bridge: "abx0", MaxBytes: minRingBytes, Ring: 2},
		{Bridge: "abx0", Write: "/x.pcap", MaxBytes: minRingBytes, Ring: maxRing + 1}} {
		if _, err := bad.Args(); err == nil {
			t.Errorf("Args(%+v) accepted", bad)
		}
	}
}

// TestRunWritesPcap runs the real tcpdump on loopback: the capture file is
// 0600, holds the packets, and a context cancel ends the capture cleanly.
func TestRunWritesPcap(t *testing.T) {
	need.Root(t, "tcpdump")
	need.Program(t, "tcpdump")
	ln := payloadServer(t, []byte("marker-in-the-capture"))
	port := ln.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	os.Chmod(dir, 0o755)
	pcap := filepath.Join(dir, "c.pcap")
	errc, stop, stderr := capture(t, Options{Bridge: "lo", Write: pcap, Filter: "tcp port " + strconv.Itoa(port)})
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		c.Read(buf)
		c.Close()
	}
	// Packets reach the file as they arrive (-U): wait for the payload
	// rather than a fixed time, which a loaded machine can outlast.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if data, _ := os.ReadFile(pcap); bytes.Contains(data, []byte("marker-in-the-capture")) || time.Now().After(deadline) {
			break
		}
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	fi, err := os.Stat(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("capture mode %o, want 600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(pcap)
	if !bytes.Contains(data, []byte("marker-in-the-capture")) {
		t.Errorf("capture (%d bytes) lacks the payload; tcpdump said:\n%s", len(data), stderr())
	}
}

// payloadServer listens on loopback and writes payload to each
// connection, then closes it.
func payloadServer(t *testing.T, payload []byte) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write(payload)
			c.Close()
		}
	}()
	return ln
}

// capture runs Run with o until tcpdump says it listens, and returns the
// channel of Run's result, the function that interrupts the capture, and
// what tcpdump said so far.
func capture(t *testing.T, o Options) (<-chan error, func(), func() string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	ready := make(chan struct{})
	var once sync.Once
	var buf bytes.Buffer
	var mu sync.Mutex
	stderr := func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
	errc := make(chan error, 1)
	go func() {
		errc <- Run(ctx, o, nil, lockedWriter{&mu, &buf}, func() { once.Do(func() { close(ready) }) })
	}()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("tcpdump ended before listening: %v\n%s", err, stderr())
	case <-ctx.Done():
		t.Fatal("tcpdump never listened")
	}
	return errc, cancel, stderr
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

type fakeSwitch struct {
	mu  sync.Mutex
	on  bool
	set []bool
}

func (f *fakeSwitch) SetKeyLog(ctx context.Context, on bool) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.on = on
	f.set = append(f.set, on)
	return "/inst/logs/keys.log", nil
}

// TestKeysLastTapTurnsOff: with two taps running, the first to end leaves
// the key log on for the other; the last turns it off.
func TestKeysLastTapTurnsOff(t *testing.T) {
	sw := &fakeSwitch{}
	lock := filepath.Join(t.TempDir(), "run", "tap.lock")
	ctx := context.Background()
	a, err := HoldKeys(ctx, sw, lock)
	if err != nil {
		t.Fatal(err)
	}
	b, err := HoldKeys(ctx, sw, lock)
	if err != nil {
		t.Fatal(err)
	}
	if a.Path != "/inst/logs/keys.log" || !sw.on {
		t.Fatalf("key log not on: %+v", sw)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !sw.on {
		t.Fatal("the first tap to end turned the key log off under the second")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if sw.on {
		t.Fatal("the last tap left the key log on")
	}
}

// TestRunStopsAtCap runs the real tcpdump on loopback with a small cap
// while traffic flows: the capture ends by itself with ErrCapReached, and
// the file is within the cap and holds whole packets only.
func TestRunStopsAtCap(t *testing.T) {
	need.Root(t, "tcpdump")
	need.Program(t, "tcpdump")
	ln := payloadServer(t, bytes.Repeat([]byte("x"), 1000))
	dir := t.TempDir()
	pcap := filepath.Join(dir, "c.pcap")
	const max = 20000
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	var mu sync.Mutex
	errc := make(chan error, 1)
	go func() {
		o := Options{Bridge: "lo", Write: pcap, MaxBytes: max, Filter: "tcp port " + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)}
		errc <- Run(ctx, o, nil, lockedWriter{&mu, &stderr}, nil)
	}()
	for {
		select {
		case err := <-errc:
			if !errors.Is(err, ErrCapReached) {
				mu.Lock()
				t.Fatalf("Run = %v, want ErrCapReached; tcpdump said:\n%s", err, stderr.String())
			}
			data, err := os.ReadFile(pcap)
			if err != nil {
				t.Fatal(err)
			}
			if len(data) > max {
				t.Fatalf("the capture file holds %d bytes, past its cap of %d", len(data), max)
			}
			if n := wholePackets(t, data); n == 0 {
				t.Fatalf("the capped file holds no packet")
			}
			return
		case <-ctx.Done():
			t.Fatal("the capture went on past its cap")
		default:
		}
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}
}

// wholePackets checks that data is a pcap header and whole packet records
// and returns how many there are.
func wholePackets(t *testing.T, data []byte) int {
	t.Helper()
	if len(data) < pcapHeaderLen || binary.LittleEndian.Uint32(data) != pcapMagicMicros {
		t.Fatalf("the file does not start with a pcap header: % x", data[:min(len(data), 8)])
	}
	n := 0
	for b := data[pcapHeaderLen:]; len(b) > 0; n++ {
		if len(b) < pcapRecordLen || len(b) < pcapRecordLen+int(binary.LittleEndian.Uint32(b[8:])) {
			t.Fatalf("the file ends inside packet %d", n+1)
		}
		b = b[pcapRecordLen+int(binary.LittleEndian.Uint32(b[8:])):]
	}
	return n
}

// TestRunRing runs the real tcpdump on loopback with a ring of two files
// at the smallest size: the capture goes on past the first file's cap
// until it is interrupted, and each file is within the cap and a capture
// of whole packets.
func TestRunRing(t *testing.T) {
	need.Root(t, "tcpdump")
	need.Program(t, "tcpdump")
	ln := payloadServer(t, bytes.Repeat([]byte("y"), 64<<10))
	pcap := filepath.Join(t.TempDir(), "r.pcap")
	errc, stop, stderr := capture(t, Options{Bridge: "lo", Write: pcap, MaxBytes: minRingBytes, Ring: 2, Filter: "tcp port " + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)})
	// Traffic until the capture has gone on into the ring's second file
	// (tcpdump drops packets on a busy loopback, so the bytes sent say
	// little about the bytes captured), then a little more.
	more := 4
	for deadline := time.Now().Add(30 * time.Second); more > 0 && time.Now().Before(deadline); {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, c)
		c.Close()
		if fi, err := os.Stat(RingName(pcap, 1, 2)); err == nil && fi.Size() > pcapHeaderLen {
			more--
		}
	}
	stop()
	if err := <-errc; err != nil {
		t.Fatalf("Run = %v, want nil (a ring goes on until interrupted); tcpdump said:\n%s", err, stderr())
	}
	for i := range 2 {
		data, err := os.ReadFile(RingName(pcap, i, 2))
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > minRingBytes {
			t.Errorf("ring file %d holds %d bytes, past its cap of %d", i, len(data), minRingBytes)
		}
		if n := wholePackets(t, data); n == 0 {
			t.Errorf("ring file %d holds no packet", i)
		}
	}
	if _, err := os.Stat(pcap); err == nil {
		t.Errorf("%s was written besides the ring's files", pcap)
	}
}
