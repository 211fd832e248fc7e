package instance

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/termtext"
)

// DefaultReadyTimeout bounds WaitReady when the caller gives none. A first
// boot under TCG takes tens of seconds here; ten times that is a broken
// guest, not a slow one.
const DefaultReadyTimeout = 5 * time.Minute

// bootFile records the last boot of an instance, for status.
const bootFile = "boot.json"

// Boot is the record of an instance's last start.
type Boot struct {
	// StartedAt is when the guest's domain was started (after the network,
	// host chains and filters were up).
	StartedAt time.Time `json:"started_at"`
	// SSHAt is when the guest first answered SSH; zero if it never did
	// (or the start did not wait).
	SSHAt time.Time `json:"ssh_at,omitzero"`
	// ReadyAt is when cloud-init had finished as well; zero as above.
	ReadyAt time.Time `json:"ready_at,omitzero"`
	// Errors are the errors cloud-init reported for this boot, if any.
	Errors []string `json:"cloud_init_errors,omitempty"`
}

// ReadyAfter is the time from start to ready, 0 when not known.
func (b Boot) ReadyAfter() time.Duration {
	if b.ReadyAt.IsZero() || b.StartedAt.IsZero() {
		return 0
	}
	return b.ReadyAt.Sub(b.StartedAt)
}

func bootPath(l paths.Layout, name string) string {
	return filepath.Join(l.Instance(name).Dir, bootFile)
}

// LastBoot returns the record of the instance's last start; a zero Boot
// when it has never been started by this version of abox.
func LastBoot(l paths.Layout, name string) (Boot, error) {
	b, err := os.ReadFile(bootPath(l, name))
	if errors.Is(err, fs.ErrNotExist) {
		return Boot{}, nil
	}
	if err != nil {
		return Boot{}, fmt.Errorf("reading the boot record of %s: %w", name, err)
	}
	var r Boot
	if err := json.Unmarshal(b, &r); err != nil {
		return Boot{}, fmt.Errorf("reading the boot record of %s: %s is damaged: %w", name, bootFile, err)
	}
	return r, nil
}

func writeBoot(l paths.Layout, name string, b Boot) error {
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(bootPath(l, name), append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the boot record of %s: %w", name, err)
	}
	return nil
}

// cloudInitResult is /run/cloud-init/result.json, which cloud-init writes
// when its last stage (modules:final) has run: the guest is configured.
type cloudInitResult struct {
	V1 struct {
		Errors []string `json:"errors"`
	} `json:"v1"`
}

// readyProbe runs in the guest: it succeeds, printing cloud-init's result,
// only once cloud-init has finished. A guest that answers SSH before then
// (sshd starts in parallel with cloud-init's later stages) is not ready:
// the proxy settings or the CA may still be missing.
const readyProbe = "cat /run/cloud-init/result.json"

// ErrNotReady means the guest did not become ready in time.
var ErrNotReady = errors.New("guest not ready")

// NotReadyError says why a guest is not ready, with the end of its serial
// console for the user.
type NotReadyError struct {
	Name    string
	Reason  string
	Serial  string // path of the serial log
	LastLog []string
}

func (e *NotReadyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "waiting for %s: %s", e.Name, e.Reason)
	if len(e.LastLog) > 0 {
		fmt.Fprintf(&b, "; last lines of its console (%s):", e.Serial)
		for _, l := range e.LastLog {
			b.WriteString("\n    ")
			b.WriteString(l)
		}
	} else {
		fmt.Fprintf(&b, "; its console log %s is empty", e.Serial)
	}
	return b.String()
}

func (e *NotReadyError) Unwrap() error { return ErrNotReady }

// WaitReady waits until the instance's guest answers SSH and cloud-init has
// finished, and records when (status shows it). It fails early when the
// guest stops, and on timeout with the end of the serial console.
func (m *Manager) WaitReady(ctx context.Context, name string, timeout time.Duration) (Boot, error) {
	if timeout <= 0 {
		timeout = DefaultReadyTimeout
	}
	st, err := Load(m.Layout, name)
	if err != nil {
		return Boot{}, err
	}
	boot, err := LastBoot(m.Layout, name)
	if err != nil {
		return Boot{}, err
	}
	if !boot.ReadyAt.IsZero() && !boot.ReadyAt.Before(boot.StartedAt) {
		// Start writes a new record for every boot: this one was seen
		// ready already (start only restarted the filters of a running
		// guest).
		return boot, nil
	}
	if boot.StartedAt.IsZero() {
		boot.StartedAt = time.Now()
	}
	args, err := SSHArgs(m.Layout, st, []string{readyProbe})
	if err != nil {
		return Boot{}, err
	}
	// A short connect timeout: until the guest's network is up every
	// attempt waits for it in full.
	args = append([]string{"-o", "ConnectTimeout=3", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=2"}, args...)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dom := libvirt.DomainName(name)
	sshAddr := net.JoinHostPort(st.GuestIP.String(), "22")
	lastNote := time.Now()
	for {
		if m.Hypervisor != nil {
			s, err := m.Hypervisor.State(wctx, dom)
			if err == nil && !s.Active() {
				return boot, m.notReady(name, fmt.Sprintf("the guest stopped while booting (state %s)", s))
			}
		}
		// A TCP connect first: it fails fast while the guest boots, where
		// an ssh attempt would wait out its connect timeout, so readiness
		// is seen within a fraction of a second.
		if m.portOpen(wctx, sshAddr) {
			actx, acancel := context.WithTimeout(wctx, 30*time.Second)
			out, err := m.Run.Run(actx, "ssh", args...)
			acancel()
			now := time.Now()
			if err == nil {
				if boot.SSHAt.IsZero() {
					boot.SSHAt = now
				}
				var res cloudInitResult
				if jerr := json.Unmarshal(bytes.TrimSpace(out), &res); jerr == nil {
					boot.ReadyAt = now
					boot.Errors = guestErrors(res.V1.Errors)
					if werr := writeBoot(m.Layout, name, boot); werr != nil {
						return boot, werr
					}
					return boot, nil
				}
			} else if sshAnswered(err) && boot.SSHAt.IsZero() {
				// sshd authenticated us and ran the probe, which found no
				// result yet: SSH is up, cloud-init is still running.
				boot.SSHAt = now
				m.progress("waiting for %s: ssh answers after %s; cloud-init is still configuring the guest", name, now.Sub(boot.StartedAt).Round(100*time.Millisecond))
			}
		}
		if time.Since(lastNote) >= 20*time.Second {
			lastNote = time.Now()
			m.progress("waiting for %s: %s since start", name, time.Since(boot.StartedAt).Round(time.Second))
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return boot, ctx.Err()
			}
			reason := fmt.Sprintf("no SSH answer within %s", timeout)
			if !boot.SSHAt.IsZero() {
				reason = fmt.Sprintf("SSH answers but cloud-init had not finished within %s", timeout)
			}
			if werr := writeBoot(m.Layout, name, boot); werr != nil {
				reason += " (" + werr.Error() + ")"
			}
			return boot, m.notReady(name, reason)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// portOpen reports whether addr accepts a TCP connection now.
func (m *Manager) portOpen(ctx context.Context, addr string) bool {
	dial := m.DialGuest
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := dial(dctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// sshAnswered tells a probe that ran in the guest (cat: no such file, on
// its stderr, which the runner puts in the error) from ssh failing to
// connect or authenticate.
func sshAnswered(err error) bool {
	return strings.Contains(err.Error(), "result.json")
}

func (m *Manager) notReady(name, reason string) error {
	f := m.Layout.Instance(name)
	return &NotReadyError{Name: name, Reason: reason, Serial: f.SerialLog, LastLog: tailLines(f.SerialLog, 15)}
}

// tailLines returns the last n non-empty lines of a file the guest wrote,
// made safe for a terminal: the serial console is the guest's to write, and
// an escape sequence in it must not reach the operator's terminal.
func tailLines(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	const window = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > window {
		if _, err := f.Seek(fi.Size()-window, 0); err != nil {
			return nil
		}
	}
	buf := make([]byte, window)
	k, _ := f.Read(buf)
	var lines []string
	for _, l := range strings.Split(string(buf[:k]), "\n") {
		l = printable(l)
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// printable is guest text made safe for a terminal.
func printable(s string) string { return termtext.Clean(s) }

// Bounds on the cloud-init errors kept from a guest's result.json.
const (
	maxGuestErrors   = 20
	maxGuestErrorLen = 500
)

// guestErrors keeps what cloud-init reported, as the guest wrote it into
// result.json (so the guest's to choose): bounded in number and length,
// and made safe for the terminal start and status print it on.
func guestErrors(errs []string) []string {
	var out []string
	for i, e := range errs {
		if i == maxGuestErrors {
			out = append(out, fmt.Sprintf("(%d more)", len(errs)-i))
			break
		}
		e = printable(e)
		if len(e) > maxGuestErrorLen {
			e = strings.ToValidUTF8(e[:maxGuestErrorLen], "") + "…"
		}
		out = append(out, e)
	}
	return out
}
