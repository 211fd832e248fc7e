package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/policy"
)

type fakeComp struct{ name string }

func (f fakeComp) Name() string { return f.name }
func (f fakeComp) Stats() any   { return map[string]int{"queries": 7} }

type fakeKeyLog struct{ on, secrets bool }

func (k *fakeKeyLog) SetKeyLogSecretSessions(on bool) error { k.secrets = on; return nil }
func (k *fakeKeyLog) KeyLogSecretSessions() bool            { return k.secrets }
func (k *fakeKeyLog) KeyLogWithheld() uint64                { return 0 }

func (k *fakeKeyLog) SetKeyLog(on bool) error { k.on = on; return nil }
func (k *fakeKeyLog) KeyLogPath() string      { return "/x/keys.log" }
func (k *fakeKeyLog) KeyLogEnabled() bool     { return k.on }
func (k *fakeKeyLog) KeyLogStopped() string   { return "" }

// startServer runs a server on a socket in a short temp dir (unix socket
// paths are limited to 108 bytes).
func startServer(t *testing.T) (*Client, *policy.Engine, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "aboxapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	eng, err := policy.New(policy.Config{AllowlistPath: filepath.Join(dir, "allow.txt")})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "run", "api.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ring := logring.New(10)
	fmt.Fprintln(ring, `{"name":"a.example.com","verdict":"block"}`)
	srv := &Server{Instance: "t1", Policy: eng, Components: []Component{fakeComp{"dns"}},
		Logs: map[string]*logring.Ring{"dns": ring}, KeyLog: &fakeKeyLog{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return NewClient(sock), eng, sock
}

func TestAPIRoundTrip(t *testing.T) {
	c, eng, sock := startServer(t)
	ctx := context.Background()

	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode = %o, want 600", perm)
	}

	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Instance != "t1" || st.Mode != policy.Active || st.Components["dns"] == nil {
		t.Errorf("status = %+v", st)
	}

	added, err := c.AllowlistAdd(ctx, []string{"Example.com", "*.example.org"})
	if err != nil || len(added) != 2 {
		t.Fatalf("add = %v, %v", added, err)
	}
	if eng.Decide("a.example.org").Verdict != allowlist.Allow {
		t.Error("add did not reach the engine")
	}
	data, _ := os.ReadFile(eng.Path())
	if !strings.Contains(string(data), "*.example.org") {
		t.Errorf("add did not reach the file: %q", data)
	}
	_, err = c.AllowlistAdd(ctx, []string{"*"})
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Error(), "allow everything") {
		t.Errorf("invalid add: %v", err)
	}
	list, err := c.Allowlist(ctx)
	if err != nil || strings.Join(list.Entries, ",") != "example.com,*.example.org" {
		t.Errorf("list = %+v, %v", list, err)
	}
	if _, err := c.AllowlistRemove(ctx, []string{"example.com"}); err != nil {
		t.Fatal(err)
	}
	if eng.Decide("example.com").Verdict != allowlist.Block {
		t.Error("remove did not reach the engine")
	}

	if err := c.SetMode(ctx, "passive"); err != nil {
		t.Fatal(err)
	}
	if m, _ := c.Mode(ctx); m != policy.Passive || eng.Mode() != policy.Passive {
		t.Errorf("mode = %s / %s", m, eng.Mode())
	}
	if err := c.SetMode(ctx, "off"); err == nil {
		t.Error("bad mode accepted")
	}
	eng.Decide("seen.example.net")
	p, err := c.Profile(ctx)
	if err != nil || len(p.Entries) != 1 || p.Entries[0].Name != "seen.example.net" {
		t.Errorf("profile = %+v, %v", p, err)
	}
	if err := c.ClearProfile(ctx); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Profile(ctx); len(p.Entries) != 0 {
		t.Errorf("profile not cleared: %+v", p)
	}

	os.WriteFile(eng.Path(), []byte("*\n"), 0o644)
	if _, err := c.Reload(ctx); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("bad reload = %v", err)
	}

	logs, err := c.Logs(ctx, "dns", 5, 0)
	if err != nil || len(logs.Lines) != 1 || logs.Seq != 1 {
		t.Errorf("logs = %+v, %v", logs, err)
	}
	if _, err := c.Logs(ctx, "nope", 5, 0); err == nil {
		t.Error("logs of unknown component succeeded")
	}
	k, err := c.SetKeyLog(ctx, true)
	if err != nil || !k.Enabled || k.SecretSessions {
		t.Errorf("keylog = %+v, %v", k, err)
	}
	// The opt-in into secret sessions is explicit, and a plain switch on
	// (a second tap) does not clear it.
	if k, err = c.KeyLogSecretSessions(ctx); err != nil || !k.SecretSessions {
		t.Errorf("keylog after opting in = %+v, %v", k, err)
	}
	if k, err = c.SetKeyLog(ctx, true); err != nil || !k.SecretSessions {
		t.Errorf("keylog switched on again = %+v, %v: the opt-in must stay", k, err)
	}
}

func TestListenRefusesLiveSocket(t *testing.T) {
	_, _, sock := startServer(t)
	if _, err := Listen(sock); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Listen = %v, want in-use error", err)
	}
}

func TestClientNotRunning(t *testing.T) {
	c := NewClient(filepath.Join(t.TempDir(), "none.sock"))
	_, err := c.Status(context.Background())
	if !errors.Is(err, ErrNotRunning) {
		t.Fatalf("err = %v, want ErrNotRunning", err)
	}
}

// TestPeerUIDChecked connects as another uid; the socket is made world-
// writable first so that only the server's peer-credential check stands.
func TestPeerUIDChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a client as another uid")
	}
	if os.Getenv("ABOX_API_TEST_CLIENT") != "" {
		return
	}
	_, _, sock := startServer(t)
	os.Chmod(sock, 0o666)
	// The test binary lives in a private build directory; give the other
	// uid a copy it can execute.
	bin := filepath.Join(filepath.Dir(sock), "api.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(sock), 0o755)
	cmd := exec.Command(bin, "-test.run=^TestPeerUIDHelper$")
	cmd.Env = append(os.Environ(), "ABOX_API_TEST_CLIENT=1", "ABOX_API_TEST_SOCK="+sock)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("client as uid 65534: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "STATUS 403") {
		t.Fatalf("client as another uid was not refused:\n%s", out)
	}
}

func TestPeerUIDHelper(t *testing.T) {
	sock := os.Getenv("ABOX_API_TEST_SOCK")
	if sock == "" {
		t.Skip("helper process only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := NewClient(sock).Status(ctx)
	var ae *Error
	if errors.As(err, &ae) {
		fmt.Printf("STATUS %d\n", ae.Status)
		return
	}
	fmt.Printf("ERR %v\n", err)
}

// TestUnknownPeerRefused: a connection whose peer credentials cannot be read
// (here TCP, which has none) is refused, not taken for root, and so is a
// request that reaches the handler without a peer at all.
func TestUnknownPeerRefused(t *testing.T) {
	dir := t.TempDir()
	eng, err := policy.New(policy.Config{AllowlistPath: filepath.Join(dir, "allow.txt")})
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Instance: "t1", Policy: eng, AllowedUIDs: []int{-1}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	for _, path := range []string{"/v1/status", "/v1/allowlist"} {
		resp, err := http.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s from a peer of unknown uid: %d, want 403", path, resp.StatusCode)
		}
	}
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("PUT", "/v1/mode", strings.NewReader(`{"mode":"passive"}`)))
	if rec.Code != http.StatusForbidden || eng.Mode() != policy.Active {
		t.Errorf("request without a peer: %d, mode %s; want 403 and active", rec.Code, eng.Mode())
	}
}

// TestAPIRules: rule lines travel both ways: added, listed as lines,
// removed one by one, with the name gone when its last rule is; a name
// listed both ways is refused with a hint that names the instance.
func TestAPIRules(t *testing.T) {
	c, eng, _ := startServer(t)
	ctx := context.Background()
	if _, err := c.AllowlistAdd(ctx, []string{"api.github.com GET,HEAD /**", "api.github.com POST /repos/acme/app/pulls", "example.com"}); err != nil {
		t.Fatal(err)
	}
	list, err := c.Allowlist(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(list.Entries, ","), "api.github.com,example.com"; got != want {
		t.Errorf("entries = %s, want %s", got, want)
	}
	if got, want := strings.Join(list.Lines, ","), "api.github.com GET,HEAD /**,api.github.com POST /repos/acme/app/pulls,example.com"; got != want {
		t.Errorf("lines = %s, want %s", got, want)
	}
	_, err = c.AllowlistAdd(ctx, []string{"api.github.com"})
	var ae *Error
	if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(ae.Error(), "listed with rules") || !strings.Contains(ae.Hint, "abox allowlist remove t1 api.github.com") {
		t.Errorf("a name with rules added without: %v (hint %q)", err, ae.Hint)
	}
	rm, err := c.AllowlistRemove(ctx, []string{"api.github.com POST /repos/acme/app/pulls"})
	if err != nil || len(rm.Gone) != 0 {
		t.Fatalf("remove one rule = %+v, %v", rm, err)
	}
	if got := eng.List().Rules("api.github.com").String(); got != "GET,HEAD /**" {
		t.Errorf("rules after removing one = %q", got)
	}
	rm, err = c.AllowlistRemove(ctx, []string{"api.github.com GET,HEAD /**"})
	if err != nil || strings.Join(rm.Gone, ",") != "api.github.com" {
		t.Errorf("remove the last rule = %+v, %v; want api.github.com gone", rm, err)
	}
}
