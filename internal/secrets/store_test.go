package secrets

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const testValue = "sk-live-5f1e2d3c4b5a69788796a5b4c3d2e1f0"

func newStore(t *testing.T) *Store {
	t.Helper()
	s := Open(filepath.Join(t.TempDir(), "secrets"))
	s.Now = func() time.Time { return time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC) }
	return s
}

func mustBind(t *testing.T, s *Store, name string, spec BindingSpec) string {
	t.Helper()
	b, err := ParseBinding(spec)
	if err != nil {
		t.Fatalf("ParseBinding(%+v): %v", spec, err)
	}
	ph, err := s.Bind(name, b)
	if err != nil {
		t.Fatalf("Bind(%s): %v", name, err)
	}
	return ph
}

// noValueIn fails when the value shows in any file under dir other than
// the secret's own value file.
func noValueIn(t *testing.T, dir, value string, allowed ...string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		for _, a := range allowed {
			if p == a {
				return nil
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.Contains(b, []byte(value)) {
			t.Errorf("%s holds the value", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStoreModesAndRotation(t *testing.T) {
	s := newStore(t)
	if err := s.Set("API_TOKEN", []byte(testValue+"\n")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want fs.FileMode
	}{
		{s.Dir, 0o700},
		{filepath.Join(s.Dir, valuesDir), 0o700},
		{filepath.Join(s.Dir, usedDir), 0o700},
		{filepath.Join(s.Dir, indexFile), 0o600},
		{s.valuePath("API_TOKEN"), 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != c.want {
			t.Errorf("%s: mode %04o, want %04o", c.path, got, c.want)
		}
	}
	got, err := s.Value(context.Background(), "API_TOKEN")
	if err != nil || string(got) != testValue {
		t.Fatalf("Value = %q, %v; want the value without its line end", got, err)
	}
	ph := mustBind(t, s, "API_TOKEN", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})

	// Rotation: the next read sees the new value; bindings and the
	// placeholder stay.
	if err := s.Set("API_TOKEN", []byte("rotated-value")); err != nil {
		t.Fatal(err)
	}
	got, err = s.Value(context.Background(), "API_TOKEN")
	if err != nil || string(got) != "rotated-value" {
		t.Fatalf("after rotation Value = %q, %v", got, err)
	}
	env, err := s.Placeholders("dev")
	if err != nil || len(env) != 1 || env[0] != [2]string{"API_TOKEN", ph} {
		t.Fatalf("Placeholders(dev) = %v, %v; want [API_TOKEN %s]", env, err, ph)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || len(list[0].Bindings) != 1 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	noValueIn(t, s.Dir, "rotated-value", s.valuePath("API_TOKEN"))
	noValueIn(t, s.Dir, testValue)
	// No temporary file is left behind by the atomic writes.
	ents, _ := os.ReadDir(filepath.Join(s.Dir, valuesDir))
	if len(ents) != 1 {
		t.Errorf("values holds %d files, want 1", len(ents))
	}
}

func TestPlaceholders(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	dev := mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	dev2 := mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "*.example.org", Header: "x-api-key"})
	prod := mustBind(t, s, "TOK", BindingSpec{Instance: "prod", Host: "api.example.com", Bearer: true})
	if dev != dev2 {
		t.Errorf("a second binding of dev changed its placeholder")
	}
	if dev == prod {
		t.Errorf("dev and prod share a placeholder")
	}
	for _, ph := range []string{dev, prod} {
		if !strings.HasPrefix(ph, PlaceholderPrefix) || len(ph) != placeholderLen {
			t.Errorf("placeholder %q: want %s and 32 hex digits", ph, PlaceholderPrefix)
		}
		if strings.Contains(ph, testValue) || strings.Contains(testValue, ph[len(PlaceholderPrefix):]) {
			t.Errorf("placeholder %q relates to the value", ph)
		}
	}
	if err := s.Unbind("TOK", "dev", "api.example.com"); err != nil {
		t.Fatal(err)
	}
	if env, _ := s.Placeholders("dev"); len(env) != 1 {
		t.Errorf("dev lost its placeholder with one binding left: %v", env)
	}
	if err := s.Unbind("TOK", "dev", "*.example.org"); err != nil {
		t.Fatal(err)
	}
	if env, _ := s.Placeholders("dev"); len(env) != 0 {
		t.Errorf("dev keeps a placeholder without bindings: %v", env)
	}
	if err := s.Remove("TOK"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.valuePath("TOK")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("rm left the value file: %v", err)
	}
	if env, _ := s.Placeholders("prod"); len(env) != 0 {
		t.Errorf("rm left prod's placeholder: %v", env)
	}
}

func TestCommandSource(t *testing.T) {
	s := newStore(t)
	var ran string
	s.Run = func(ctx context.Context, command string) ([]byte, error) {
		ran = command
		if _, ok := ctx.Deadline(); !ok {
			t.Error("the value command runs without a deadline")
		}
		return []byte(testValue + "\n"), nil
	}
	if err := s.SetCommand("TOK", "pass show api/token", 0); err != nil {
		t.Fatal(err)
	}
	v, err := s.Value(context.Background(), "TOK")
	if err != nil || string(v) != testValue || ran != "pass show api/token" {
		t.Fatalf("Value = %q, %v (ran %q)", v, err, ran)
	}
	noValueIn(t, s.Dir, testValue)
	list, _ := s.List()
	if list[0].Source != SourceCommand || list[0].Command != "pass show api/token" {
		t.Errorf("List = %+v", list[0])
	}
}

func TestShellRunner(t *testing.T) {
	out, err := ShellRunner(context.Background(), "printf '%s\\n' "+testValue)
	if err != nil || strings.TrimSpace(string(out)) != testValue {
		t.Fatalf("ShellRunner = %q, %v", out, err)
	}
	// A failing helper's output (stdout and stderr) stays out of the error.
	_, err = ShellRunner(context.Background(), "echo "+testValue+"; echo "+testValue+" >&2; exit 3")
	if err == nil || strings.Contains(err.Error(), testValue) {
		t.Fatalf("error = %v; want one without the output", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := ShellRunner(ctx, "sleep 5"); err == nil {
		t.Fatal("a command past its deadline succeeded")
	}
}

func TestStoreRefusesOpenDirectory(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := s.Value(context.Background(), "TOK")
	if err == nil || !strings.Contains(err.Error(), "chmod 700") {
		t.Fatalf("Value in a 0755 store: %v; want a refusal naming chmod 700", err)
	}
}

// TestValueNeverInErrors feeds the store and the binding parser bad input
// that holds the value, and checks no error text quotes it.
func TestValueNeverInErrors(t *testing.T) {
	s := newStore(t)
	secret := "hunter2-" + testValue
	var errs []error
	add := func(err error) {
		if err == nil {
			t.Errorf("bad input %d accepted", len(errs))
			errs = append(errs, errors.New(""))
			return
		}
		errs = append(errs, err)
	}
	add(s.Set("TOK", []byte(secret+"\x00tail")))
	add(s.Set("TOK", []byte(secret+"\nsecond line")))
	add(s.Set("TOK", []byte(" "+secret)))
	add(s.Set("TOK", bytes.Repeat([]byte(secret), MaxValueBytes)))
	add(s.Set("TOK", nil))
	if err := s.Set("TOK", []byte(secret)); err != nil {
		t.Fatal(err)
	}
	s.Run = func(context.Context, string) ([]byte, error) { return []byte(secret + "\x01"), nil }
	if err := s.SetCommand("CMD", "helper", 0); err != nil {
		t.Fatal(err)
	}
	_, err := s.Value(context.Background(), "CMD")
	add(err)
	_, err = s.Value(context.Background(), "NOPE")
	add(err)
	_, err = s.Bind("NOPE", Binding{Instance: "dev", Host: "a.example.com", Port: 443, Send: SendBearer, Header: "Authorization"})
	add(err)
	add(s.Unbind("TOK", "dev", "a.example.com"))
	add(s.Remove("NOPE"))
	add(s.MarkUsed("bad name", time.Now()))
	// A corrupt index is reported by file and offset only.
	b, _ := os.ReadFile(filepath.Join(s.Dir, indexFile))
	if err := os.WriteFile(filepath.Join(s.Dir, indexFile), append(b, []byte("garbage")...), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = s.List()
	add(err)
	_, err = s.Value(context.Background(), "TOK")
	add(err)
	for _, err := range errs {
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("error %q holds the value", err)
		}
		if u, ok := errors.AsType[*ValueError](err); ok && u.Secret == "" {
			t.Errorf("value error %q does not name the secret", err)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"OPENAI_API_KEY", true},
		{"gh_token", true},
		{"_X", true},
		{"", false},
		{"1TOKEN", false},
		{"MY-TOKEN", false},
		{"a b", false},
		{"HTTPS_PROXY", false},
		{"https_proxy", false},
		{"PATH", false},
		{"ABOX_TOKEN", false},
		{strings.Repeat("A", 65), false},
		{"../x", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckName(c.name)
			if (err == nil) != c.ok {
				t.Fatalf("CheckName(%q) = %v, want ok=%v", c.name, err, c.ok)
			}
		})
	}
}

func TestParseBinding(t *testing.T) {
	for _, c := range []struct {
		name string
		spec BindingSpec
		want string // error substring, "" for success
		host string
		port uint16
	}{
		{"bearer", BindingSpec{Instance: "dev", Host: "API.Example.com.", Bearer: true}, "", "api.example.com", 443},
		{"port", BindingSpec{Instance: "dev", Host: "api.example.com:8443", Bearer: true}, "", "api.example.com", 8443},
		{"wildcard", BindingSpec{Instance: "dev", Host: "*.example.com", Header: "X-Api-Key"}, "", "*.example.com", 443},
		{"basic", BindingSpec{Instance: "dev", Host: "git.example.com", Basic: "x-access-token", Rules: []string{"GET,POST /org/repo.git/**"}}, "", "git.example.com", 443},
		{"no send", BindingSpec{Instance: "dev", Host: "a.example.com"}, "--bearer, --basic USER or --header NAME", "", 0},
		{"two sends", BindingSpec{Instance: "dev", Host: "a.example.com", Bearer: true, Header: "x"}, "only one", "", 0},
		{"public suffix wildcard", BindingSpec{Instance: "dev", Host: "*.co.uk", Bearer: true}, "public suffix", "", 0},
		{"psl below", BindingSpec{Instance: "dev", Host: "*.amazonaws.com", Bearer: true}, "public suffix", "", 0},
		{"scheme", BindingSpec{Instance: "dev", Host: "https://a.example.com/v1", Bearer: true}, "without scheme or path", "", 0},
		{"bad port", BindingSpec{Instance: "dev", Host: "a.example.com:0", Bearer: true}, "1-65535", "", 0},
		{"no host", BindingSpec{Instance: "dev", Bearer: true}, "--host", "", 0},
		{"bad instance", BindingSpec{Instance: "-x", Host: "a.example.com", Bearer: true}, "instance", "", 0},
		{"bad rule", BindingSpec{Instance: "dev", Host: "a.example.com", Bearer: true, Rules: []string{"v1/**"}}, "POST /v1/**", "", 0},
		{"audit rule", BindingSpec{Instance: "dev", Host: "a.example.com", Bearer: true, Rules: []string{"POST /v1/** audit"}}, "drop the word audit", "", 0},
		{"authorization header", BindingSpec{Instance: "dev", Host: "a.example.com", Header: "authorization"}, "--bearer or --basic", "", 0},
		{"framing header", BindingSpec{Instance: "dev", Host: "a.example.com", Header: "Content-Length"}, "frames the request", "", 0},
		{"cookie", BindingSpec{Instance: "dev", Host: "a.example.com", Header: "cookie"}, "frames the request", "", 0},
		{"bad header", BindingSpec{Instance: "dev", Host: "a.example.com", Header: "x api"}, "header name", "", 0},
		{"basic colon", BindingSpec{Instance: "dev", Host: "a.example.com", Basic: "a:b"}, "without ':'", "", 0},
		{"ip", BindingSpec{Instance: "dev", Host: "10.0.0.1", Bearer: true}, "IP addresses", "", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := ParseBinding(c.spec)
			if c.want != "" {
				if err == nil || !strings.Contains(err.Error(), c.want) {
					t.Fatalf("ParseBinding = %v; want an error with %q", err, c.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Host != c.host || b.Port != c.port {
				t.Errorf("host, port = %s, %d; want %s, %d", b.Host, b.Port, c.host, c.port)
			}
			if _, err := compile("X", b); err != nil {
				t.Errorf("a parsed binding does not compile: %v", err)
			}
		})
	}
}

func TestSourceSeesChanges(t *testing.T) {
	s := newStore(t)
	src := s.Source("dev")
	p, err := src.Policy()
	if err != nil || !p.Empty() {
		t.Fatalf("empty store: %v, %v", p, err)
	}
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	p, err = src.Policy()
	if err != nil || p.Empty() {
		t.Fatalf("after bind the policy is empty (%v)", err)
	}
	if p2, _ := src.Policy(); p2 != p {
		t.Errorf("an unchanged index was read again")
	}
	if err := s.Unbind("TOK", "dev", "api.example.com"); err != nil {
		t.Fatal(err)
	}
	if p, _ = src.Policy(); !p.Empty() {
		t.Errorf("after unbind the policy still binds")
	}
}

func TestIndexJSONHoldsNoValue(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	list, _ := s.List()
	b, _ := json.Marshal(list)
	if bytes.Contains(b, []byte(testValue)) || bytes.Contains(b, []byte(PlaceholderPrefix)) {
		t.Errorf("List's JSON holds the value or a placeholder: %s", b)
	}
}

func TestUseMarker(t *testing.T) {
	s := newStore(t)
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	m := &UseMarker{Store: s}
	t0 := time.Date(2026, 12, 4, 13, 0, 0, 0, time.UTC)
	for i, c := range []struct {
		at   time.Time
		want time.Time
	}{
		{t0, t0},
		{t0.Add(30 * time.Second), t0},
		{t0.Add(61 * time.Second), t0.Add(61 * time.Second)},
	} {
		if err := m.Used([]string{"TOK"}, c.at); err != nil {
			t.Fatal(err)
		}
		list, _ := s.List()
		if !list[0].LastUsed.Equal(c.want) {
			t.Errorf("use %d: last used %v, want %v", i, list[0].LastUsed, c.want)
		}
	}
}

func TestForgetInstance(t *testing.T) {
	s := newStore(t)
	if err := s.ForgetInstance("dev"); err != nil {
		t.Fatalf("ForgetInstance on no store: %v", err)
	}
	if err := s.Set("TOK", []byte(testValue)); err != nil {
		t.Fatal(err)
	}
	mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	mustBind(t, s, "TOK", BindingSpec{Instance: "prod", Host: "api.example.com", Bearer: true})
	if err := s.ForgetInstance("dev"); err != nil {
		t.Fatal(err)
	}
	if env, _ := s.Placeholders("dev"); len(env) != 0 {
		t.Errorf("dev keeps placeholders: %v", env)
	}
	if p, _ := s.Policy("dev"); !p.Empty() {
		t.Errorf("dev keeps bindings")
	}
	if env, _ := s.Placeholders("prod"); len(env) != 1 {
		t.Errorf("prod lost its placeholder: %v", env)
	}
	if _, err := os.Stat(s.Dir); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentRotation: a daemon reading policies and values while the
// CLI rotates and rebinds sees one whole value or the other, never a mix.
func TestConcurrentRotation(t *testing.T) {
	s := newStore(t)
	const a, b = "value-aaaaaaaaaaaa", "value-bbbbbbbbbbbb"
	if err := s.Set("TOK", []byte(a)); err != nil {
		t.Fatal(err)
	}
	mustBind(t, s, "TOK", BindingSpec{Instance: "dev", Host: "api.example.com", Bearer: true})
	src := s.Source("dev")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 50 {
			v := a
			if i%2 == 1 {
				v = b
			}
			if err := s.Set("TOK", []byte(v)); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for {
		select {
		case <-done:
			return
		default:
		}
		if p, err := src.Policy(); err != nil || p.Empty() {
			t.Fatalf("policy during rotation: %v (empty %v)", err, p.Empty())
		}
		v, err := s.Value(context.Background(), "TOK")
		if err != nil {
			t.Fatalf("Value during rotation: %v", err)
		}
		if string(v) != a && string(v) != b {
			t.Fatalf("Value during rotation = %q, a mix", v)
		}
	}
}

// TestSourceValueRunsACommandOnceForABurst: concurrent requests that need
// a command-backed secret share one run of the command, and a request that
// goes away does not cancel the run the others wait for.
func TestSourceValueRunsACommandOnceForABurst(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "secrets"))
	var runs atomic.Int32
	release := make(chan struct{})
	s.Run = func(ctx context.Context, command string) ([]byte, error) {
		runs.Add(1)
		select {
		case <-release:
			return []byte("cmd-value-7f3a\n"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := s.SetCommand("TOKEN", "helper get token", 0); err != nil {
		t.Fatal(err)
	}
	src := s.Source("dev")
	gone, cancel := context.WithCancel(context.Background())
	var wg, entered sync.WaitGroup
	errs := make(chan error, 9)
	for i := range 9 {
		ctx := context.Background()
		if i == 0 {
			ctx = gone // this request goes away while the command runs
		}
		wg.Add(1)
		entered.Add(1)
		go func() {
			defer wg.Done()
			entered.Done()
			v, err := src.Value(ctx, "TOKEN")
			if err == nil && string(v) != "cmd-value-7f3a" {
				err = fmt.Errorf("value %q", v)
			}
			errs <- err
		}()
	}
	entered.Wait()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // every caller is in the run in flight
	cancel()
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a request's value: %v", err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the command ran %d times for one burst, want 1", n)
	}
}
