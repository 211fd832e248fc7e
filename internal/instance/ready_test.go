package instance

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/libvirt"
	"github.com/abox-dev/abox/internal/termtext"
)

// sshScript answers the ready probe: the guest is unreachable for the first
// `down` calls, then answers SSH without cloud-init's result for `booting`
// calls, then prints the result. Other programs go to the rig's runner.
type sshScript struct {
	base          Runner
	mu            sync.Mutex
	down, booting int
	calls         int
	result        string
	sawProbe      string
}

func (s *sshScript) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	if name != "ssh" {
		return s.base.Run(ctx, name, args...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.sawProbe = args[len(args)-1]
	switch {
	case s.calls <= s.down:
		return nil, errors.New("running ssh: exit status 255: ssh: connect to host 10.10.2.10 port 22: Connection timed out")
	case s.calls <= s.down+s.booting:
		return nil, errors.New("running ssh: exit status 1: cat: /run/cloud-init/result.json: No such file or directory")
	}
	return []byte(s.result), nil
}

func startedRig(t *testing.T) (*rig, *sshScript) {
	t.Helper()
	r := newRig(t)
	if _, _, err := r.m.Create(context.Background(), Spec{Name: "dev", Accel: "tcg"}); err != nil {
		t.Fatal(err)
	}
	s := &sshScript{base: r.m.Run}
	r.m.Run = s
	// The guest's SSH port: a real listener on loopback stands in for it.
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
			c.Close()
		}
	}()
	r.m.DialGuest = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, ln.Addr().String())
	}
	if err := r.m.Start(context.Background(), "dev"); err != nil {
		t.Fatal(err)
	}
	return r, s
}

func TestWaitReadyWaitsForCloudInit(t *testing.T) {
	r, s := startedRig(t)
	s.down, s.booting = 1, 1
	// result.json is the guest's to write: what it says reaches start's
	// warning and status, so it is kept bounded and terminal-safe.
	many := strings.Repeat(`"x",`, 40)
	s.result = `{"v1": {"datasource": "DataSourceNoCloud", "errors": ["some module failed", "\u001b]52;c;cm0gLXJmIH4=\u0007\u001b[1A\u001b[2Kok \u202e", "` + strings.Repeat("y", 5000) + `", ` + many + `"z"]}}`
	var progress strings.Builder
	r.m.Progress = &progress
	b, err := r.m.WaitReady(context.Background(), "dev", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if s.calls != 3 {
		t.Errorf("probed %d times, want 3: ready only once cloud-init's result exists", s.calls)
	}
	if s.sawProbe != readyProbe {
		t.Errorf("probe = %q", s.sawProbe)
	}
	if b.SSHAt.IsZero() || b.ReadyAt.IsZero() || b.ReadyAt.Before(b.SSHAt) || b.SSHAt.Before(b.StartedAt) {
		t.Errorf("boot = %+v: want started <= ssh <= ready", b)
	}
	if len(b.Errors) != maxGuestErrors+1 || b.Errors[0] != "some module failed" || b.Errors[maxGuestErrors] != "(24 more)" {
		t.Errorf("errors = %q, want cloud-init's, bounded", b.Errors)
	}
	for _, e := range b.Errors {
		if termtext.Check(e) != nil || len(e) > maxGuestErrorLen+len("…") {
			t.Errorf("kept error %q: %v, %d bytes", e, termtext.Check(e), len(e))
		}
	}
	if !strings.Contains(progress.String(), "ssh answers") {
		t.Errorf("progress = %q, want the SSH phase reported", progress.String())
	}
	saved, err := LastBoot(r.m.Layout, "dev")
	if err != nil || !saved.ReadyAt.Equal(b.ReadyAt) {
		t.Errorf("LastBoot = %+v, %v; want the record status shows", saved, err)
	}
	if fi, err := os.Stat(bootPath(r.m.Layout, "dev")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("boot record mode: %v %v", fi, err)
	}
	info, err := r.m.Describe(context.Background(), "dev")
	if err != nil || info.LastBoot.ReadyAfter() != b.ReadyAfter() {
		t.Errorf("Describe().LastBoot = %+v, %v", info.LastBoot, err)
	}
}

func TestWaitReadyTimesOutWithTheConsole(t *testing.T) {
	r, s := startedRig(t)
	s.down = 1 << 30
	f := r.m.Layout.Instance("dev")
	if err := os.MkdirAll(f.LogsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The guest writes its console: an escape sequence must not reach the
	// operator's terminal through the error.
	console := "Booting\n[  OK  ] Reached target\n\x1b]0;pwned\x07Kernel panic - not syncing: VFS\n"
	if err := os.WriteFile(f.SerialLog, []byte(console), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := r.m.WaitReady(context.Background(), "dev", 1500*time.Millisecond)
	var nr *NotReadyError
	if !errors.As(err, &nr) || !errors.Is(err, ErrNotReady) {
		t.Fatalf("err = %v, want a NotReadyError", err)
	}
	msg := err.Error()
	for _, want := range []string{"no SSH answer within", f.SerialLog, "Kernel panic - not syncing: VFS"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if strings.ContainsAny(msg, "\x1b\x07") {
		t.Errorf("error carries the guest's control characters: %q", msg)
	}
}

func TestWaitReadyStopsWhenTheGuestDies(t *testing.T) {
	r, s := startedRig(t)
	s.down = 1 << 30
	r.hv.mu.Lock()
	r.hv.domains[libvirt.DomainName("dev")] = libvirt.StateShutoff
	r.hv.mu.Unlock()
	t0 := time.Now()
	_, err := r.m.WaitReady(context.Background(), "dev", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "stopped while booting") {
		t.Fatalf("err = %v, want the guest's stop reported", err)
	}
	if time.Since(t0) > 20*time.Second {
		t.Errorf("took %s: a stopped guest must fail at once, not at the timeout", time.Since(t0))
	}
}

func TestWaitReadyKeepsTheRecordOfAGuestAlreadyReady(t *testing.T) {
	r, s := startedRig(t)
	s.result = `{"v1": {"errors": []}}`
	first, err := r.m.WaitReady(context.Background(), "dev", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	calls := s.calls
	again, err := r.m.WaitReady(context.Background(), "dev", time.Minute)
	if err != nil || !again.ReadyAt.Equal(first.ReadyAt) || s.calls != calls {
		t.Errorf("second wait = %+v, %v after %d probes: want the first boot's record, no new probe", again, err, s.calls-calls)
	}
}
