package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/api"
	"github.com/abox-dev/abox/internal/policy"
)

type svc struct {
	name string
	err  error // returned by Serve at once when set
}

func (s svc) Name() string { return s.name }
func (s svc) Stats() any   { return map[string]int{"n": 1} }
func (s svc) Serve(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	<-ctx.Done()
	return nil
}

func setup(t *testing.T) (*policy.Engine, string) {
	dir, err := os.MkdirTemp("", "aboxd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	eng, err := policy.New(policy.Config{AllowlistPath: filepath.Join(dir, "allow.txt")})
	if err != nil {
		t.Fatal(err)
	}
	return eng, filepath.Join(dir, "api.sock")
}

func TestRunServesAPIAndReloadsOnHangup(t *testing.T) {
	eng, sock := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, Options{Instance: "t", Policy: eng, Services: []Service{svc{name: "dns"}}, APISocket: sock, Ready: func() { close(ready) }})
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	}
	st, err := api.NewClient(sock).Status(ctx)
	if err != nil || st.Components["dns"] == nil {
		t.Fatalf("status = %+v, %v", st, err)
	}
	// The file is unchanged, so the watch stays quiet: only SIGHUP can
	// cause this reload.
	before := eng.Status().Reloads
	syscall.Kill(os.Getpid(), syscall.SIGHUP)
	waitReload(t, eng, before, "SIGHUP")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("api socket left behind: %v", err)
	}
}

// A failing filter stops the whole daemon: nothing keeps running
// half-configured, and the supervisor restarts it from scratch.
func TestServiceFailureStopsEverything(t *testing.T) {
	eng, sock := setup(t)
	done := make(chan error, 1)
	go func() {
		done <- serve(context.Background(), Options{Instance: "t", Policy: eng,
			Services: []Service{svc{name: "dns"}, svc{name: "http", err: errors.New("listener closed")}}, APISocket: sock})
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "http filter: listener closed") {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run kept going after a filter failed")
	}
}

// A hangup sent the moment the daemon says it is ready (a supervisor
// reloading right after start) reloads the allowlist; before SIGHUP was
// caught ahead of Ready it could meet the default action and end the
// process.
func TestHangupAtReadyReloads(t *testing.T) {
	eng, sock := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	before := eng.Status().Reloads
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, Options{Instance: "t", Policy: eng, Services: []Service{svc{name: "dns"}}, APISocket: sock,
			Ready: func() { syscall.Kill(os.Getpid(), syscall.SIGHUP) }})
	}()
	waitReload(t, eng, before, "a SIGHUP at Ready")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel = %v", err)
	}
}

// waitReload waits for a reload after before, with room for a loaded machine.
func waitReload(t *testing.T, eng *policy.Engine, before uint64, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); eng.Status().Reloads == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not reload the allowlist", what)
		}
	}
}
