// Package tap captures an instance's bridge traffic with tcpdump and, while a
// capture runs, has the proxy write the TLS session keys of intercepted
// sessions to the instance's key log so that the capture can be decrypted.
package tap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/termtext"
	"github.com/abox-dev/abox/internal/validate"
)

// Options describe one capture.
type Options struct {
	// Bridge is the instance's bridge interface (validated).
	Bridge string
	// Write is the pcap file to write; empty prints decoded packets.
	Write string
	// Count stops after this many packets; 0 means until interrupted.
	Count int
	// MaxBytes caps the capture file (Write), pcap header included: the
	// capture stops, the file ending on a whole packet, before it would
	// pass the cap. 0 means no cap; the CLI's default is DefaultMaxBytes.
	MaxBytes int64
	// Ring, 2 or more, keeps a ring of that many files of up to MaxBytes
	// instead of stopping at the cap, named as RingName names them: the
	// oldest is overwritten, as tcpdump's -C with -W does. 0 means none.
	Ring int
	// Filter is a BPF expression ANDed with the default exclusions.
	Filter string
	// IncludeSSH keeps host↔guest SSH (left out by default: it is abox's
	// own control channel and would drown everything else).
	IncludeSSH bool
	// Extra are passed to tcpdump after abox's own arguments.
	Extra []string
}

// ErrNoTcpdump means tcpdump is not installed.
var ErrNoTcpdump = errors.New("tcpdump is not installed")

// BPF is the filter expression the capture uses.
func (o Options) BPF() string {
	var parts []string
	if f := strings.TrimSpace(o.Filter); f != "" {
		parts = append(parts, "("+f+")")
	}
	if !o.IncludeSSH {
		parts = append(parts, "not (tcp port 22)")
	}
	return strings.Join(parts, " and ")
}

// CheckLimits checks the count, the cap and the ring.
func (o Options) CheckLimits() error {
	if o.Count < 0 {
		return fmt.Errorf("packet count %d: want 0 (no limit) or more", o.Count)
	}
	if o.MaxBytes < 0 || (o.MaxBytes > 0 && o.MaxBytes <= pcapHeaderLen) {
		return fmt.Errorf("capture file cap of %d bytes: want 0 (no cap) or room for a packet", o.MaxBytes)
	}
	switch {
	case o.Ring == 0:
	case o.Ring < 2 || o.Ring > maxRing:
		return fmt.Errorf("a ring of %d capture files: want 2 to %d", o.Ring, maxRing)
	case o.Write == "":
		return errors.New("a ring of capture files needs a file to write")
	case o.MaxBytes < minRingBytes:
		return fmt.Errorf("a ring of capture files of %d bytes each: want at least %d, so that every packet fits in one", o.MaxBytes, minRingBytes)
	}
	return nil
}

// Args is tcpdump's argument list. A capture file is written by abox from
// tcpdump's standard output (-w -), so tcpdump can keep dropping its root
// privileges before it parses a hostile guest's packets and the file is
// created 0600 by abox (it holds what the guest sent).
func (o Options) Args() ([]string, error) {
	if err := validate.Bridge(o.Bridge); err != nil {
		return nil, err
	}
	if err := o.CheckLimits(); err != nil {
		return nil, err
	}
	// --immediate-mode: packets reach the terminal or the file as they
	// arrive rather than in ring-buffer blocks, so a short or interrupted
	// capture still holds them.
	args := []string{"-i", o.Bridge, "-n", "--immediate-mode"}
	if o.Write != "" {
		args = append(args, "-U", "-w", "-")
	} else {
		args = append(args, "-l")
	}
	if o.Count > 0 {
		args = append(args, "-c", strconv.Itoa(o.Count))
	}
	args = append(args, o.Extra...)
	if f := o.BPF(); f != "" {
		args = append(args, f)
	}
	return args, nil
}

// Run runs tcpdump until it exits (count reached) or ctx ends, when it is
// interrupted so that it flushes and reports its counters. Decoded packets or
// the pcap stream go to stdout or to o.Write; tcpdump's diagnostics to stderr.
// ready, if set, is called once tcpdump says it is listening.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer, ready func()) error {
	args, err := o.Args()
	if err != nil {
		return err
	}
	bin, err := exec.LookPath("tcpdump")
	if err != nil {
		return ErrNoTcpdump
	}
	cmd := exec.Command(bin, args...)
	// Decoded packets are the guest's bytes as tcpdump prints them (-A
	// and -X among the extra arguments print payloads): they reach the
	// terminal escaped.
	tw := termtext.NewWriter(stdout)
	defer tw.Flush()
	var out io.Writer = tw
	var cf *capFile
	if o.Write != "" {
		name := o.Write
		if o.Ring > 0 {
			name = RingName(o.Write, 0, o.Ring)
		}
		f, err := createCapture(name)
		if err != nil {
			return err
		}
		cf = newCapFile(f, o.MaxBytes)
		defer cf.close()
		if o.Ring > 0 {
			cf.nextFile = func() (sink, int, error) {
				i := (cf.file + 1) % o.Ring
				f, err := createCapture(RingName(o.Write, i, o.Ring))
				return f, i, err
			}
		}
		out = cf
	}
	cmd.Stdout = out
	cmd.Stderr = &readyWriter{w: stderr, ready: ready}
	// Its own process group: the terminal's Ctrl-C reaches abox, which
	// interrupts tcpdump itself and then still turns the key log off.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting tcpdump: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var cut <-chan struct{}
	if cf != nil {
		cut = cf.stop
	}
	interrupted := false
	select {
	case err = <-done:
	case <-cut:
		// The file is at its cap or could not be written: the capture
		// ends here, and says why below.
		err = interrupt(cmd, done)
	case <-ctx.Done():
		err = interrupt(cmd, done)
		interrupted = true
	}
	if cf != nil {
		if packets, size, cerr := cf.result(); cerr != nil {
			return fmt.Errorf("capture file %s (%d packets, %d bytes): %w", o.Write, packets, size, cerr)
		}
	}
	if interrupted {
		// An interrupted capture is a finished capture.
		var ee *exec.ExitError
		if err == nil || errors.As(err, &ee) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("tcpdump on %s: %w", o.Bridge, err)
	}
	return nil
}

// Bounds of a ring of capture files: a packet tcpdump writes always fits
// in one file with the header.
const (
	maxRing      = 10000
	minRingBytes = pcapHeaderLen + pcapRecordLen + maxPcapRecord
)

// RingName is the name of file i of a ring of n capture files written
// for name: name with i appended, zero-padded to the width of n-1, as
// tcpdump -w name -W n names them (dev.pcap0 … dev.pcap9).
func RingName(name string, i, n int) string {
	return fmt.Sprintf("%s%0*d", name, len(strconv.Itoa(n-1)), i)
}

// createCapture creates (or empties) a capture file, 0600: it holds what
// the guest sent.
func createCapture(name string) (*os.File, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the capture file: %w", err)
	}
	return f, nil
}

// interrupt stops tcpdump as Ctrl-C does, so that it flushes and reports
// its counters, and kills it if it does not end.
func interrupt(cmd *exec.Cmd, done <-chan error) error {
	cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		return <-done
	}
}

// readyWriter passes tcpdump's stderr through and calls ready on the
// "listening on" line.
type readyWriter struct {
	w     io.Writer
	ready func()
	seen  bool
	buf   []byte
}

func (r *readyWriter) Write(b []byte) (int, error) {
	if !r.seen && r.ready != nil {
		r.buf = append(r.buf, b...)
		if strings.Contains(string(r.buf), "listening on") {
			r.seen = true
			r.buf = nil
			r.ready()
		} else if len(r.buf) > 4096 {
			r.buf = r.buf[len(r.buf)-1024:]
		}
	}
	return r.w.Write(b)
}

// KeyLogSwitch is the instance API's key-log switch.
type KeyLogSwitch interface {
	SetKeyLog(ctx context.Context, enabled bool) (path string, err error)
}

// Keys holds the key log on for the time of a capture. Several taps of one
// instance may run at once: each holds a shared lock on lockPath, and the
// last one to finish (the one that gets the lock exclusively) turns the key
// log off.
type Keys struct {
	sw   KeyLogSwitch
	lock *os.File
	// Path is where the proxy writes the keys.
	Path string
}

// HoldKeys turns the key log on and takes a shared hold on it.
func HoldKeys(ctx context.Context, sw KeyLogSwitch, lockPath string) (*Keys, error) {
	if err := os.MkdirAll(filepath.Dir(lockPath), 0o700); err != nil {
		return nil, fmt.Errorf("holding the key log: %w", err)
	}
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("holding the key log: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		f.Close()
		return nil, fmt.Errorf("holding the key log: %w", err)
	}
	path, err := sw.SetKeyLog(ctx, true)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Keys{sw: sw, lock: f, Path: path}, nil
}

// Release turns the key log off unless another tap still holds it.
func (k *Keys) Release(ctx context.Context) error {
	defer k.lock.Close()
	if err := syscall.Flock(int(k.lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil // another tap runs: it turns the log off when it ends
	}
	_, err := k.sw.SetKeyLog(ctx, false)
	return err
}
