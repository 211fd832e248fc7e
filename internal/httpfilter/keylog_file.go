package httpfilter

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
)

// DefaultKeyLogMaxBytes is the key log's cap when none is configured: a
// guest that opens TLS sessions without end would otherwise fill the
// host's disk with about 600 bytes of keys each.
const DefaultKeyLogMaxBytes = 100 * 1000 * 1000

// keyLog is the switchable NSS key log shared by every interception. It
// writes whole lines only and never past its cap: a line that would pass
// it, or that cannot be written (a full disk), stops the log until it is
// switched off and on again; stopped says why, and the file is cut back
// to its last whole line. The session whose key was not written goes on:
// it is one the capture cannot decrypt, like one before the tap started.
type keyLog struct {
	path string
	max  int64 // 0: DefaultKeyLogMaxBytes
	log  *slog.Logger

	mu      sync.Mutex
	f       *os.File // nil when off
	size    int64    // bytes in the file, a line boundary
	stopped string   // why no more keys are written, while on
	// secrets, while on, writes the keys of sessions that carried an
	// injected secret too (abox tap --keys-of-secret-sessions); switching
	// the log off clears it.
	secrets bool
	// withheld counts the sessions whose keys were left out because they
	// carried an injected secret, since the proxy started.
	withheld atomic.Uint64
}

func (k *keyLog) state() (on, secrets bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.f != nil && k.stopped == "", k.secrets
}

// session returns the key line writer of one intercepted TLS session.
// hold is whether a secret is bound to its host (Policy.Binds).
func (k *keyLog) session(hold bool) *sessionKeys {
	return &sessionKeys{log: k, hold: hold}
}

// sessionKeys writes one intercepted TLS session's key lines so that no
// key of a session that carried an injected secret reaches the key log
// (a capture decrypted with it would show the value): a session to a host
// no secret is bound to writes its lines at once; one to a bound host
// holds them (a few hundred bytes) until it ends and writes them only if
// it injected nothing. A binding added after a session's handshake finds
// its keys written: inject then says no and the request is refused rather
// than sent (errKeysLogged). The opt-in (keyLog.secrets) writes every
// line at once and allows every injection.
type sessionKeys struct {
	log  *keyLog
	hold bool

	mu       sync.Mutex
	lines    []byte // held, whole lines
	logged   bool   // a line went to the key log
	injected bool
}

func (s *sessionKeys) Write(b []byte) (int, error) {
	on, secrets := s.log.state()
	if !on {
		return len(b), nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if secrets || (!s.hold && !s.injected) {
		s.logged = true
		return s.log.Write(b)
	}
	s.lines = append(s.lines, b...)
	return len(b), nil
}

// inject reports whether a secret may be injected on the session: not
// when its keys are already in the key log, unless opted in.
func (s *sessionKeys) inject() bool {
	_, secrets := s.log.state()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.logged && !secrets {
		return false
	}
	s.injected = true
	return true
}

// end writes the held lines of a session that injected nothing, or counts
// it as withheld.
func (s *sessionKeys) end() {
	_, secrets := s.log.state()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.lines) == 0 {
		return
	}
	if s.injected && !secrets {
		s.log.withheld.Add(1)
	} else {
		s.log.Write(s.lines)
	}
	s.lines = nil
}

func (k *keyLog) cap() int64 {
	if k.max > 0 {
		return k.max
	}
	return DefaultKeyLogMaxBytes
}

func (k *keyLog) Write(b []byte) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.f == nil || k.stopped != "" {
		return len(b), nil
	}
	if k.size+int64(len(b)) > k.cap() {
		k.stop(fmt.Sprintf("%s reached its cap of %d bytes", k.path, k.cap()))
		return len(b), nil
	}
	if _, err := k.f.Write(b); err != nil {
		if terr := k.f.Truncate(k.size); terr != nil {
			err = errors.Join(err, terr)
		}
		k.stop(fmt.Sprintf("writing %s: %v", k.path, err))
		return len(b), nil
	}
	k.size += int64(len(b))
	return len(b), nil
}

func (k *keyLog) stop(why string) {
	k.stopped = why
	k.log.Warn("tls key log stopped: sessions from now on cannot be decrypted", "reason", why)
}

func (k *keyLog) set(on bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !on {
		if k.f == nil {
			return nil
		}
		err := k.f.Close()
		k.f, k.stopped, k.secrets = nil, "", false
		return err
	}
	if k.f != nil {
		return nil
	}
	if k.path == "" {
		return errors.New("enabling key log: no key log path configured")
	}
	f, size, err := openKeyLog(k.path)
	if err != nil {
		return err
	}
	if size >= k.cap() {
		f.Close()
		return fmt.Errorf("enabling key log: %s holds %d bytes, its cap is %d: delete it (it decrypts the captures taken while it was written) to log keys again", k.path, size, k.cap())
	}
	k.f, k.size = f, size
	return nil
}

// openKeyLog appends to the key log, creating it 0600: the keys decrypt
// everything the guest sent. It returns the file and its size.
func openKeyLog(path string) (*os.File, int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, 0, fmt.Errorf("enabling key log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, fmt.Errorf("enabling key log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("enabling key log: %w", err)
	}
	return f, st.Size(), nil
}
