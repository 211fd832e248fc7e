// Package secrets is the host-side secret store and the decision the proxy
// makes with it: which secret a request may carry, in which header, and
// which requests are attempts to send a placeholder where it does not go.
package secrets

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
	"github.com/abox-dev/abox/internal/validate"
)

// Sources of a secret's value.
const (
	// SourceFile: the value is a file of the store, read at every use.
	SourceFile = "file"
	// SourceCommand: the value is what a host command prints, run at every
	// use; the store keeps the command line, never its output.
	SourceCommand = "command"
)

// Limits on values.
const (
	// MaxValueBytes bounds a value: it goes in one header line.
	MaxValueBytes = 16 << 10
	// DefaultCommandTimeout bounds a value command that sets none.
	DefaultCommandTimeout = 10 * time.Second
)

// PlaceholderPrefix starts every placeholder, so that a guest, a log
// reader and the proxy's scan recognise one.
const PlaceholderPrefix = "abox-ph-"

// Files of the store, below its directory (paths.Layout.Secrets).
const (
	indexFile = "index.json" // names, sources, bindings, placeholders; no value
	valuesDir = "values"     // one file per SourceFile secret, 0600
	usedDir   = "used"       // one file per secret: its last use, RFC 3339
	lockFile  = ".lock"
)

// namePattern is an environment variable name: the guest sees the
// placeholder under the secret's name.
var namePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// reservedNames are variables the guest's environment already sets or
// relies on; a placeholder there would break the guest or the proxy.
var reservedNames = []string{
	"PATH", "HOME", "USER", "SHELL", "TERM", "LANG", "PWD",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY",
	"NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CARGO_HTTP_CAINFO",
	"JAVA_TOOL_OPTIONS", "NPM_CONFIG_PROXY", "NPM_CONFIG_HTTPS_PROXY",
}

// CheckName reports whether name is a valid secret name.
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("secret name %q: want an environment variable name (letters, digits and _, not starting with a digit, at most 64), such as OPENAI_API_KEY; the guest sees the placeholder under it", name)
	}
	for _, r := range reservedNames {
		if strings.EqualFold(name, r) {
			return fmt.Errorf("secret name %q: the guest's environment already uses %s; choose another name", name, r)
		}
	}
	if strings.HasPrefix(strings.ToUpper(name), "ABOX_") {
		return fmt.Errorf("secret name %q: names starting with ABOX_ are abox's own; choose another name", name)
	}
	return nil
}

// ValueError says what is wrong with a value without quoting any of it.
type ValueError struct {
	Secret string
	Why    string
}

func (e *ValueError) Error() string { return "secret " + e.Secret + ": value " + e.Why }

// checkValue: a value goes in one header field, so it is what RFC 9110
// allows there (visible ASCII, space, tab, obs-text), without a leading or
// trailing space, which a header parser would strip.
func checkValue(name string, v []byte) error {
	switch {
	case len(v) == 0:
		return &ValueError{name, "is empty; give the secret on standard input or with --from-file"}
	case len(v) > MaxValueBytes:
		return &ValueError{name, fmt.Sprintf("is %d bytes, more than the %d one header can carry", len(v), MaxValueBytes)}
	case v[0] == ' ' || v[0] == '\t' || v[len(v)-1] == ' ' || v[len(v)-1] == '\t':
		return &ValueError{name, "starts or ends with white space, which HTTP strips from a header; remove it"}
	}
	for i, c := range v {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return &ValueError{name, fmt.Sprintf("holds a control character at byte %d (a header cannot carry it); a value is one line", i)}
		}
	}
	return nil
}

// trimNewline drops one trailing line end: `echo x | abox secret set` and
// most files end the value with one.
func trimNewline(v []byte) []byte {
	v = bytes.TrimSuffix(v, []byte("\n"))
	return bytes.TrimSuffix(v, []byte("\r"))
}

// Runner runs a value command on the host and returns its standard
// output. Its error must not hold the output.
type Runner func(ctx context.Context, command string) ([]byte, error)

// ShellRunner runs command with /bin/sh -c, standard input empty, standard
// error discarded (a credential helper may print the value there too).
func ShellRunner(ctx context.Context, command string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", command)
	// The helper's own children (gpg under pass) die with it at the
	// deadline: the whole process group is killed, and a child still
	// holding standard output open is not waited for long.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out limitedBuffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("running the value command: %w", ctx.Err())
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			// ExitError's text is the status only; its Stderr is unset here.
			return nil, fmt.Errorf("running the value command: %s", ee.ProcessState.String())
		}
		return nil, fmt.Errorf("running the value command: %w", err)
	}
	if out.over {
		return nil, fmt.Errorf("running the value command: it printed more than %d bytes", MaxValueBytes)
	}
	return out.b.Bytes(), nil
}

// limitedBuffer keeps at most MaxValueBytes+2 bytes (a value and its line end).
type limitedBuffer struct {
	b    bytes.Buffer
	over bool
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	room := MaxValueBytes + 2 - l.b.Len()
	if len(p) > room {
		l.over = true
		l.b.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return l.b.Write(p)
}

// Store is the secret store in one directory. It holds no value in
// memory: every use reads the value file (or runs the command), so a
// rotation is seen by the next request of every daemon.
type Store struct {
	// Dir is the store's directory, created 0700.
	Dir string
	// Now is the clock; time.Now when nil.
	Now func() time.Time
	// Rand makes placeholders; crypto/rand when nil.
	Rand io.Reader
	// Run runs value commands; ShellRunner when nil.
	Run Runner
}

// Open returns the store in dir.
func Open(dir string) *Store { return &Store{Dir: dir} }

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// index is the store's index file. It never holds a value.
type index struct {
	Version int               `json:"version"`
	Secrets map[string]*entry `json:"secrets"`
}

type entry struct {
	// Source is SourceFile or SourceCommand.
	Source string `json:"source"`
	// Command is the value command line (SourceCommand only).
	Command string `json:"command,omitempty"`
	// Timeout bounds the command; 0 means DefaultCommandTimeout.
	Timeout  time.Duration `json:"timeout,omitempty"`
	Created  time.Time     `json:"created"`
	Updated  time.Time     `json:"updated"`
	Bindings []Binding     `json:"bindings,omitempty"`
	// Placeholders maps an instance with a binding to its placeholder.
	Placeholders map[string]string `json:"placeholders,omitempty"`
}

const indexVersion = 1

// checkDir refuses a store others can read: a value file is 0600, but a
// directory mode that lets others list or replace files is a sign the
// store was copied or tampered with.
func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("secret store %s: not a directory; move it away", dir)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("secret store %s: mode %04o lets other users in; run chmod 700 %s", dir, fi.Mode().Perm(), dir)
	}
	return nil
}

// ensureDirs creates the store's directories 0700.
func (s *Store) ensureDirs() error {
	for _, d := range []string{s.Dir, filepath.Join(s.Dir, valuesDir), filepath.Join(s.Dir, usedDir)} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("creating the secret store: %w", err)
		}
		if err := checkDir(d); err != nil {
			return err
		}
	}
	return nil
}

// lock takes the store's exclusive lock for a read-modify-write of the
// index; the returned function releases it.
func (s *Store) lock() (func(), error) {
	if err := s.ensureDirs(); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(s.Dir, lockFile), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the secret store: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the secret store: %w", err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// load reads the index; a missing store is an empty one.
func (s *Store) load() (*index, error) {
	ix := &index{Version: indexVersion, Secrets: map[string]*entry{}}
	b, err := os.ReadFile(filepath.Join(s.Dir, indexFile))
	if errors.Is(err, fs.ErrNotExist) {
		return ix, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the secret store: %w", err)
	}
	if err := checkDir(s.Dir); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	err = dec.Decode(ix)
	if err == nil && dec.More() {
		err = errors.New("data after the index")
	}
	if err != nil {
		// The JSON decoder quotes at most a type name and an offset; the
		// index holds no value anyway.
		return nil, fmt.Errorf("reading the secret store %s: %w", filepath.Join(s.Dir, indexFile), err)
	}
	if ix.Version != indexVersion {
		return nil, fmt.Errorf("reading the secret store: index version %d, this abox reads %d; upgrade abox", ix.Version, indexVersion)
	}
	if ix.Secrets == nil {
		ix.Secrets = map[string]*entry{}
	}
	return ix, nil
}

func (s *Store) save(ix *index) error {
	b, err := json.MarshalIndent(ix, "", "  ")
	if err != nil {
		return fmt.Errorf("writing the secret store: %w", err)
	}
	return fsutil.WriteFileAtomic(filepath.Join(s.Dir, indexFile), append(b, '\n'), 0o600)
}

// update runs f on the index under the lock and saves it when f succeeds.
func (s *Store) update(f func(ix *index) error) error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	ix, err := s.load()
	if err != nil {
		return err
	}
	if err := f(ix); err != nil {
		return err
	}
	return s.save(ix)
}

func (s *Store) valuePath(name string) string { return filepath.Join(s.Dir, valuesDir, name) }

// Set stores value as secret name, creating or rotating it (a rotation
// keeps its bindings and placeholders). One trailing line end is dropped.
func (s *Store) Set(name string, value []byte) error {
	if err := CheckName(name); err != nil {
		return err
	}
	value = trimNewline(value)
	if err := checkValue(name, value); err != nil {
		return err
	}
	return s.update(func(ix *index) error {
		// The value file first: an index naming a secret whose file is
		// missing would refuse its requests; a file without an entry is
		// only unused.
		if err := fsutil.WriteFileAtomic(s.valuePath(name), value, 0o600); err != nil {
			return fmt.Errorf("storing secret %s: %w", name, err)
		}
		e := s.entryFor(ix, name)
		e.Source, e.Command, e.Timeout = SourceFile, "", 0
		return nil
	})
}

// SetCommand makes secret name's value the output of command, run on the
// host at every use with timeout (0: DefaultCommandTimeout).
func (s *Store) SetCommand(name, command string, timeout time.Duration) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if strings.TrimSpace(command) == "" {
		return fmt.Errorf("secret %s: empty command; give the command that prints the value, such as --command 'pass show api/token'", name)
	}
	if strings.ContainsAny(command, "\x00\n\r") {
		return fmt.Errorf("secret %s: the command holds a line break or NUL; give one command line (a script's path will do)", name)
	}
	if timeout < 0 || timeout > 5*time.Minute {
		return fmt.Errorf("secret %s: timeout %v: want between 0 (the default, %v) and 5m", name, timeout, DefaultCommandTimeout)
	}
	return s.update(func(ix *index) error {
		e := s.entryFor(ix, name)
		e.Source, e.Command, e.Timeout = SourceCommand, command, timeout
		if err := os.Remove(s.valuePath(name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("storing secret %s: removing its old value: %w", name, err)
		}
		return nil
	})
}

func (s *Store) entryFor(ix *index, name string) *entry {
	e := ix.Secrets[name]
	now := s.now()
	if e == nil {
		e = &entry{Created: now}
		ix.Secrets[name] = e
	}
	e.Updated = now
	return e
}

// ErrNotFound is wrapped by errors about a secret that is not stored.
var ErrNotFound = errors.New("no such secret")

func notFound(name string) error {
	return fmt.Errorf("secret %s: %w (abox secret list shows the stored ones)", name, ErrNotFound)
}

// Remove deletes secret name, its value, bindings and placeholders.
func (s *Store) Remove(name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	return s.update(func(ix *index) error {
		if ix.Secrets[name] == nil {
			return notFound(name)
		}
		delete(ix.Secrets, name)
		for _, p := range []string{s.valuePath(name), filepath.Join(s.Dir, usedDir, name)} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("removing secret %s: %w", name, err)
			}
		}
		return nil
	})
}

// Bind adds b to secret name, replacing a binding of the same instance,
// host and port, and returns the instance's placeholder for the secret
// (made on its first binding to the instance).
func (s *Store) Bind(name string, b Binding) (string, error) {
	if err := CheckName(name); err != nil {
		return "", err
	}
	if _, err := compile(name, b); err != nil {
		return "", err
	}
	var ph string
	err := s.update(func(ix *index) error {
		e := ix.Secrets[name]
		if e == nil {
			return fmt.Errorf("%w; store it first with abox secret set %s", notFound(name), name)
		}
		i := slices.IndexFunc(e.Bindings, func(o Binding) bool { return sameTarget(o, b) })
		if i >= 0 {
			e.Bindings[i] = b
		} else {
			e.Bindings = append(e.Bindings, b)
		}
		if e.Placeholders == nil {
			e.Placeholders = map[string]string{}
		}
		ph = e.Placeholders[b.Instance]
		if ph == "" {
			p, err := s.newPlaceholder()
			if err != nil {
				return err
			}
			ph = p
			e.Placeholders[b.Instance] = ph
		}
		e.Updated = s.now()
		return nil
	})
	return ph, err
}

// Unbind removes secret name's binding of instance to host (with its
// port, "host:port", when not 443). The instance's placeholder goes with
// its last binding.
func (s *Store) Unbind(name, instance, host string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	if err := validate.InstanceName(instance); err != nil {
		return fmt.Errorf("instance: %w", err)
	}
	h, port, err := parseHost(host)
	if err != nil {
		return err
	}
	return s.update(func(ix *index) error {
		e := ix.Secrets[name]
		if e == nil {
			return notFound(name)
		}
		i := slices.IndexFunc(e.Bindings, func(o Binding) bool {
			return sameTarget(o, Binding{Instance: instance, Host: h, Port: port})
		})
		if i < 0 {
			return fmt.Errorf("secret %s has no binding of instance %s to %s (abox secret list shows its bindings)", name, instance, host)
		}
		e.Bindings = slices.Delete(e.Bindings, i, i+1)
		if !slices.ContainsFunc(e.Bindings, func(o Binding) bool { return o.Instance == instance }) {
			delete(e.Placeholders, instance)
		}
		e.Updated = s.now()
		return nil
	})
}

// ForgetInstance removes every binding and placeholder of instance, for
// abox remove: a later instance of the same name starts without them.
func (s *Store) ForgetInstance(instance string) error {
	if err := validate.InstanceName(instance); err != nil {
		return fmt.Errorf("instance: %w", err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, indexFile)); errors.Is(err, fs.ErrNotExist) {
		return nil // no store, nothing to forget
	}
	return s.update(func(ix *index) error {
		for _, e := range ix.Secrets {
			n := len(e.Bindings)
			e.Bindings = slices.DeleteFunc(e.Bindings, func(b Binding) bool { return b.Instance == instance })
			_, had := e.Placeholders[instance]
			delete(e.Placeholders, instance)
			if len(e.Bindings) != n || had {
				e.Updated = s.now()
			}
		}
		return nil
	})
}

// newPlaceholder is PlaceholderPrefix and 128 random bits in hex: it holds
// nothing of the value and is different per instance and secret.
func (s *Store) newPlaceholder() (string, error) {
	r := s.Rand
	if r == nil {
		r = rand.Reader
	}
	b := make([]byte, 16)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", fmt.Errorf("making a placeholder: %w", err)
	}
	return PlaceholderPrefix + hex.EncodeToString(b), nil
}

// Info is what abox secret list shows of one secret: never its value.
type Info struct {
	Name     string    `json:"name"`
	Source   string    `json:"source"`
	Command  string    `json:"command,omitempty"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	LastUsed time.Time `json:"last_used,omitzero"`
	Bindings []Binding `json:"bindings"`
}

// List returns every secret, by name.
func (s *Store) List() ([]Info, error) {
	ix, err := s.load()
	if err != nil {
		return nil, err
	}
	out := make([]Info, 0, len(ix.Secrets))
	for name, e := range ix.Secrets {
		in := Info{Name: name, Source: e.Source, Command: e.Command, Created: e.Created, Updated: e.Updated, Bindings: e.Bindings}
		if in.Bindings == nil {
			in.Bindings = []Binding{}
		}
		if b, err := os.ReadFile(filepath.Join(s.Dir, usedDir, name)); err == nil {
			if t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(b))); err == nil {
				in.LastUsed = t
			}
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Placeholders returns the environment instance's guest gets: each bound
// secret's name and the instance's placeholder for it, by name.
func (s *Store) Placeholders(instance string) ([][2]string, error) {
	ix, err := s.load()
	if err != nil {
		return nil, err
	}
	var env [][2]string
	for name, e := range ix.Secrets {
		if ph := e.Placeholders[instance]; ph != "" {
			env = append(env, [2]string{name, ph})
		}
	}
	sort.Slice(env, func(i, j int) bool { return env[i][0] < env[j][0] })
	return env, nil
}

// Value returns secret name's value, read (or run) now. Its errors name
// the secret, never the value.
func (s *Store) Value(ctx context.Context, name string) ([]byte, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	ix, err := s.load()
	if err != nil {
		return nil, err
	}
	e := ix.Secrets[name]
	if e == nil {
		return nil, notFound(name)
	}
	var v []byte
	switch e.Source {
	case SourceFile:
		if err := checkDir(filepath.Join(s.Dir, valuesDir)); err != nil {
			return nil, err
		}
		v, err = os.ReadFile(s.valuePath(name))
		if err != nil {
			return nil, fmt.Errorf("reading secret %s: %w", name, err)
		}
	case SourceCommand:
		t := e.Timeout
		if t == 0 {
			t = DefaultCommandTimeout
		}
		run := s.Run
		if run == nil {
			run = ShellRunner
		}
		cctx, cancel := context.WithTimeout(ctx, t)
		defer cancel()
		v, err = run(cctx, e.Command)
		if err != nil {
			return nil, fmt.Errorf("secret %s: %w", name, err)
		}
		v = trimNewline(v)
	default:
		return nil, fmt.Errorf("secret %s: unknown source %q in the store; set it again", name, e.Source)
	}
	if err := checkValue(name, v); err != nil {
		return nil, err
	}
	return v, nil
}

// MarkUsed records t as secret name's last use (for abox secret list). A
// daemon calls it at most every so often, not per request.
func (s *Store) MarkUsed(name string, t time.Time) error {
	if err := CheckName(name); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(s.Dir, usedDir, name), []byte(t.UTC().Format(time.RFC3339)+"\n"), 0o600)
}
