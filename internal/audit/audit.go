// Package audit is an instance's tamper-evident audit stream: append-only
// JSON lines in which each line holds the SHA-256 of the line before, with a
// keyed checkpoint (HMAC-SHA256) every so often, rotated into numbered files
// that are never deleted, so that a changed, removed or reordered line is
// found by Verify and named by file and line (docs/audit.md).
package audit

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Files of a stream's directory. The active file is FileName; a rotated
// one is RotatedPrefix + a six-digit number (its order) + ".log".
const (
	FileName      = "audit.log"
	RotatedPrefix = "audit-"
	lockName      = "audit.lock"
	// KeyFile is the checkpoint key's file name in the abox data dir.
	KeyFile = "audit.key"
)

// Defaults of Config fields left zero.
const (
	DefaultMaxBytes           = 16 << 20
	DefaultCheckpointEvery    = 1000
	DefaultCheckpointInterval = time.Minute
)

// Kinds of record.
const (
	KindDecision   = "decision"
	KindCheckpoint = "checkpoint"
	KindRotated    = "rotated"
	KindPolicy     = "policy"
	KindMode       = "mode"
	KindFilters    = "filters_started"
	KindExport     = "audit_export"
)

// Record is one line of the stream. Its encoding is json.Marshal's, whose
// field order is fixed, so a line's bytes are what was hashed.
type Record struct {
	// Seq counts the stream's lines from 1, across rotations.
	Seq uint64 `json:"seq"`
	// Prev is the hex SHA-256 of the line before (its bytes without the
	// newline); empty for the stream's first line.
	Prev string    `json:"prev"`
	Time time.Time `json:"time"`
	Kind string    `json:"kind"`
	// Data is the event: a decision line as the filter wrote it, a policy
	// change's hashes, ...
	Data json.RawMessage `json:"data,omitempty"`
	// MAC, on a checkpoint, is the hex HMAC-SHA256 under the host's key of
	// checkpointMessage(Seq, Prev).
	MAC string `json:"mac,omitempty"`
}

// checkpointMessage is what a checkpoint's MAC covers: its place in the
// stream and the hash of everything before it.
func checkpointMessage(seq uint64, prev string) []byte {
	return []byte("abox-audit-checkpoint\n" + strconv.FormatUint(seq, 10) + "\n" + prev)
}

func mac(key []byte, seq uint64, prev string) string {
	m := hmac.New(sha256.New, key)
	m.Write(checkpointMessage(seq, prev))
	return hex.EncodeToString(m.Sum(nil))
}

func lineHash(line []byte) string {
	h := sha256.Sum256(line)
	return hex.EncodeToString(h[:])
}

// LoadKey reads the checkpoint key from path (ReadKey), creating it (32
// random bytes, mode 0600) when it does not exist.
func LoadKey(path string) ([]byte, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("audit key: %w", err)
		}
		tf, err := os.CreateTemp(filepath.Dir(path), ".audit-key-*") // mode 0600
		if err != nil {
			return nil, fmt.Errorf("audit key: %w", err)
		}
		tmp := tf.Name()
		_, werr := tf.Write(key)
		if cerr := tf.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(tmp)
			return nil, fmt.Errorf("audit key: %w", werr)
		}
		// Link, not rename: two processes creating it at once keep one key.
		if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
			os.Remove(tmp)
			return nil, fmt.Errorf("audit key: %w", err)
		}
		os.Remove(tmp)
		return ReadKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	return ReadKey(path)
}

// ReadKey reads the checkpoint key from path, which must exist, be 32 bytes
// and be readable by its owner only.
func ReadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("audit key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("audit key %s is readable by others (mode %o): chmod 600 it", path, fi.Mode().Perm())
	}
	if len(b) != 32 {
		return nil, fmt.Errorf("audit key %s holds %d bytes, want 32: restore it from a backup (a new key cannot verify old checkpoints)", path, len(b))
	}
	return b, nil
}

// Config configures a Stream.
type Config struct {
	// Dir is the instance's logs directory; required.
	Dir string
	// Key is the checkpoint key (LoadKey); required.
	Key []byte
	// MaxBytes is the size past which the active file is rotated
	// (DefaultMaxBytes if 0). Rotated files are never deleted.
	MaxBytes int64
	// CheckpointEvery and CheckpointInterval: a checkpoint follows this
	// many lines, or the first line this long after the last checkpoint
	// (defaults if 0), and one is written at each rotation and Close.
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Stream appends to one instance's audit stream. Several processes may
// append at once (the filter daemon, a CLI command): every append holds an
// exclusive lock on the directory's lock file and continues from the file's
// last line as it is on disk.
type Stream struct {
	cfg Config
	mu  sync.Mutex
	// lock is the open lock file; f the active file, nil until first use.
	lock *os.File
	f    *os.File
	// seq and hash are the last line's, valid while the active file is
	// ino and size bytes long.
	seq       uint64
	hash      string
	ino       uint64
	size      int64
	sinceMark int
	lastMark  time.Time
	closed    bool
	// buf is the batch being encoded, reused; guarded by mu.
	buf bytes.Buffer
}

// Open opens the stream in cfg.Dir (created 0700 if missing).
func Open(cfg Config) (*Stream, error) {
	if cfg.Dir == "" || len(cfg.Key) == 0 {
		return nil, errors.New("audit stream: no directory or no key")
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.CheckpointEvery <= 0 {
		cfg.CheckpointEvery = DefaultCheckpointEvery
	}
	if cfg.CheckpointInterval <= 0 {
		cfg.CheckpointInterval = DefaultCheckpointInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit stream: %w", err)
	}
	lk, err := os.OpenFile(filepath.Join(cfg.Dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit stream: %w", err)
	}
	return &Stream{cfg: cfg, lock: lk, lastMark: cfg.Now()}, nil
}

// Append writes one record of kind with data (JSON-encoded).
func (s *Stream) Append(kind string, data any) error {
	raw, err := json.Marshal(data)
	if err != nil {
		return fmt.Errorf("audit %s: %w", kind, err)
	}
	return s.append(kind, [][]byte{raw})
}

// Write takes whole decision lines, as a decisionlog.Writer hands its
// sinks a batch: each becomes a decision record, in order, in one write.
func (s *Stream) Write(p []byte) (int, error) {
	var lines [][]byte
	for rest := p; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if !looksLikeObject(line) {
			// Kept as evidence, as a string.
			line, _ = json.Marshal(string(line))
		}
		lines = append(lines, line)
	}
	if len(lines) == 0 {
		return len(p), nil
	}
	if err := s.append(KindDecision, lines); err != nil {
		return 0, err
	}
	return len(p), nil
}

// looksLikeObject is the cheap check of a decision line before it is
// embedded as is: one JSON object on one line, as the decision log's
// encoder and slog write them. Anything else is embedded as a string.
func looksLikeObject(line []byte) bool {
	return len(line) >= 2 && line[0] == '{' && line[len(line)-1] == '}' && bytes.IndexByte(line, '\n') < 0
}

// Close writes a checkpoint and closes the stream.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.locked(func(buf *bytes.Buffer) error {
		if s.sinceMark > 0 {
			s.checkpoint(buf)
		}
		return nil
	})
	if s.f != nil {
		s.f.Close()
	}
	s.lock.Close()
	return err
}

func (s *Stream) append(kind string, data [][]byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("audit stream: closed")
	}
	return s.locked(func(buf *bytes.Buffer) error {
		now := s.cfg.Now()
		for _, d := range data {
			s.add(buf, Record{Time: now, Kind: kind, Data: d})
			if s.sinceMark >= s.cfg.CheckpointEvery || now.Sub(s.lastMark) >= s.cfg.CheckpointInterval {
				s.checkpoint(buf)
			}
		}
		return nil
	})
}

// locked runs fill under the directory's lock, with the tail in sync with
// the disk and the active file rotated if it is full, and writes what fill
// put in buf in one write.
func (s *Stream) locked(fill func(*bytes.Buffer) error) error {
	if err := syscall.Flock(int(s.lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("audit stream: locking: %w", err)
	}
	defer syscall.Flock(int(s.lock.Fd()), syscall.LOCK_UN)
	if err := s.sync(); err != nil {
		return err
	}
	buf := &s.buf
	buf.Reset()
	if s.size >= s.cfg.MaxBytes {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	if err := fill(buf); err != nil {
		return err
	}
	if buf.Len() == 0 {
		return nil
	}
	n, err := s.f.Write(buf.Bytes())
	s.size += int64(n)
	if err != nil {
		// The tail is no longer known: read it again next time.
		s.ino = 0
		return fmt.Errorf("audit stream: writing %s: %w", s.f.Name(), err)
	}
	return nil
}

// add encodes r as the next line into buf, by hand: the same JSON as
// json.Marshal of a Record (Verify decodes it so), without reflection or
// re-validating Data, which is a whole JSON value by construction.
func (s *Stream) add(buf *bytes.Buffer, r Record) {
	r.Seq, r.Prev = s.seq+1, s.hash
	start := buf.Len()
	b := buf.AvailableBuffer()
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, r.Seq, 10)
	b = append(b, `,"prev":"`...)
	b = append(b, r.Prev...)
	b = append(b, `","time":"`...)
	b = r.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","kind":"`...)
	b = append(b, r.Kind...) // one of the Kind constants: nothing to escape
	b = append(b, '"')
	if len(r.Data) > 0 {
		b = append(b, `,"data":`...)
		b = append(b, r.Data...)
	}
	if r.MAC != "" {
		b = append(b, `,"mac":"`...)
		b = append(b, r.MAC...)
		b = append(b, '"')
	}
	b = append(b, '}')
	buf.Write(b)
	line := buf.Bytes()[start:]
	s.seq, s.hash = r.Seq, lineHash(line)
	buf.WriteByte('\n')
	if r.Kind == KindCheckpoint {
		s.sinceMark, s.lastMark = 0, r.Time
	} else {
		s.sinceMark++
	}
}

func (s *Stream) checkpoint(buf *bytes.Buffer) {
	seq := s.seq + 1
	s.add(buf, Record{Time: s.cfg.Now(), Kind: KindCheckpoint, MAC: mac(s.cfg.Key, seq, s.hash)})
}

// sync makes s.f the active file on disk and s.seq, s.hash its last line.
func (s *Stream) sync() error {
	path := filepath.Join(s.cfg.Dir, FileName)
	if s.f != nil {
		if fi, err := os.Stat(path); err == nil && inode(fi) == s.ino && fi.Size() == s.size {
			return nil
		}
		s.f.Close()
		s.f = nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit stream: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("audit stream: %w", err)
	}
	s.f, s.ino, s.size = f, inode(fi), fi.Size()
	last, err := lastLine(f, fi.Size())
	if err != nil {
		return err
	}
	if last == nil {
		// An empty active file: the chain goes on from the newest rotated
		// one (a crash between a rotation's rename and its first line).
		rot, err := rotated(s.cfg.Dir)
		if err != nil {
			return err
		}
		if len(rot) > 0 {
			rf, err := os.Open(filepath.Join(s.cfg.Dir, rot[len(rot)-1].name))
			if err != nil {
				return fmt.Errorf("audit stream: %w", err)
			}
			rfi, _ := rf.Stat()
			last, err = lastLine(rf, rfi.Size())
			rf.Close()
			if err != nil {
				return err
			}
		}
	}
	s.seq, s.hash = 0, ""
	if last != nil {
		var r Record
		if err := json.Unmarshal(last, &r); err != nil {
			return s.pastTorn(f, fi.Size(), last)
		}
		s.seq, s.hash = r.Seq, lineHash(last)
	}
	return nil
}

// pastTorn continues the chain after a last line that does not parse (a
// write cut short by a crash, or an edit): the line is ended if it must
// be, counts as the line after the last one that parses, and the chain
// goes on from its hash, as Verify reads it; Verify still reports it.
func (s *Stream) pastTorn(f *os.File, size int64, torn []byte) error {
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil && err != io.EOF {
		return fmt.Errorf("audit stream: reading %s: %w", f.Name(), err)
	}
	if b[len(b)-1] != '\n' {
		n, err := f.Write([]byte{'\n'})
		s.size += int64(n)
		if err != nil {
			return fmt.Errorf("audit stream: ending the torn last line of %s: %w", f.Name(), err)
		}
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	seq := uint64(0)
	for i := len(lines) - 2; i >= 0; i-- {
		var r Record
		if json.Unmarshal(lines[i], &r) == nil {
			seq = r.Seq + uint64(len(lines)-2-i)
			break
		}
	}
	s.seq, s.hash = seq+1, lineHash(torn)
	return nil
}

// rotate renames the full active file to the next rotated name and starts
// a new one whose first line, a rotated record, chains to its last line.
func (s *Stream) rotate() error {
	rot, err := rotated(s.cfg.Dir)
	if err != nil {
		return err
	}
	n := 1
	if len(rot) > 0 {
		n = rot[len(rot)-1].n + 1
	}
	name := fmt.Sprintf("%s%06d.log", RotatedPrefix, n)
	var buf bytes.Buffer
	s.checkpoint(&buf)
	if _, err := s.f.Write(buf.Bytes()); err != nil {
		s.ino = 0
		return fmt.Errorf("audit stream: %w", err)
	}
	s.f.Sync()
	if err := os.Rename(filepath.Join(s.cfg.Dir, FileName), filepath.Join(s.cfg.Dir, name)); err != nil {
		return fmt.Errorf("audit stream: rotating: %w", err)
	}
	s.f.Close()
	f, err := os.OpenFile(filepath.Join(s.cfg.Dir, FileName), os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		s.f = nil
		return fmt.Errorf("audit stream: %w", err)
	}
	fi, _ := f.Stat()
	s.f, s.ino, s.size = f, inode(fi), 0
	from, _ := json.Marshal(map[string]string{"from": name})
	buf.Reset()
	s.add(&buf, Record{Time: s.cfg.Now(), Kind: KindRotated, Data: from})
	n2, err := s.f.Write(buf.Bytes())
	s.size += int64(n2)
	if err != nil {
		s.ino = 0
		return fmt.Errorf("audit stream: %w", err)
	}
	return nil
}

type rotatedFile struct {
	name string
	n    int
}

// rotated lists dir's rotated files in their order.
func rotated(dir string) ([]rotatedFile, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit stream: %w", err)
	}
	var out []rotatedFile
	for _, e := range ents {
		name := e.Name()
		if len(name) != len(RotatedPrefix)+6+4 || name[:len(RotatedPrefix)] != RotatedPrefix || filepath.Ext(name) != ".log" {
			continue
		}
		n, err := strconv.Atoi(name[len(RotatedPrefix) : len(RotatedPrefix)+6])
		if err != nil {
			continue
		}
		out = append(out, rotatedFile{name, n})
	}
	// ReadDir sorts by name, and the numbers are zero-padded.
	return out, nil
}

// lastLine returns the last whole line of f (size bytes), without its
// newline, or nil for an empty file.
func lastLine(f *os.File, size int64) ([]byte, error) {
	if size == 0 {
		return nil, nil
	}
	const chunk = 64 << 10
	var tail []byte
	for off := size; off > 0; {
		n := int64(chunk)
		if off < n {
			n = off
		}
		off -= n
		b := make([]byte, n)
		if _, err := f.ReadAt(b, off); err != nil && err != io.EOF {
			return nil, fmt.Errorf("audit stream: reading %s: %w", f.Name(), err)
		}
		tail = append(b, tail...)
		t := bytes.TrimRight(tail, "\n")
		if i := bytes.LastIndexByte(t, '\n'); i >= 0 {
			return t[i+1:], nil
		}
		if off == 0 {
			return t, nil
		}
	}
	return nil, nil
}

func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
