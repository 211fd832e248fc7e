package audit

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/abox-dev/abox/internal/fsutil"
)

// Problem is one place where the stream is not what was written.
type Problem struct {
	File string `json:"file"`
	Line int    `json:"line"`
	What string `json:"what"`
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.What) }

// Report is what Verify found.
type Report struct {
	Files       []string  `json:"files"`
	Lines       int       `json:"lines"`
	Checkpoints int       `json:"checkpoints"`
	Problems    []Problem `json:"problems,omitempty"`
	// Unsealed counts the lines after the last checkpoint: chained, but
	// not yet covered by the key (a stream still being written).
	Unsealed int `json:"unsealed"`
	// First and Last are the times of the first and last lines.
	First time.Time `json:"first,omitzero"`
	Last  time.Time `json:"last,omitzero"`
}

// OK reports whether no problem was found.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Anchor is where a partial stream (an export --since) starts: the Seq
// and Prev of its first line. The zero Anchor is the stream's beginning.
type Anchor struct {
	Seq  uint64 `json:"seq"`
	Prev string `json:"prev"`
}

// Files lists the stream's files in dir in order (rotated ones, then the
// active one), and rotated numbers missing between them.
func Files(dir string) (names []string, missing []string, err error) {
	rot, err := rotated(dir)
	if err != nil {
		return nil, nil, err
	}
	for i, r := range rot {
		if i > 0 {
			for n := rot[i-1].n + 1; n < r.n; n++ {
				missing = append(missing, fmt.Sprintf("%s%06d.log", RotatedPrefix, n))
			}
		}
		names = append(names, r.name)
	}
	if _, err := os.Stat(filepath.Join(dir, FileName)); err == nil {
		names = append(names, FileName)
	}
	return names, missing, nil
}

// Verify checks the stream in dir from start: every line parses, its Seq
// follows the one before, its Prev is the hash of the line before (across
// files), and every checkpoint's MAC is key's. A changed line breaks the
// chain at the line after it, a removed one at the line after the gap, a
// reordered pair at the first of them: each is reported there, by file
// and line.
func Verify(dir string, key []byte, start Anchor) (Report, error) {
	var rep Report
	names, missing, err := Files(dir)
	if err != nil {
		return rep, err
	}
	if len(names) == 0 {
		return rep, fmt.Errorf("no audit stream in %s", dir)
	}
	rep.Files = names
	for _, m := range missing {
		rep.Problems = append(rep.Problems, Problem{File: m, What: "this rotated file is missing: its lines were removed"})
	}
	seq, prev := start.Seq, start.Prev
	if seq > 0 {
		seq-- // Anchor is the first line's own Seq
	}
	for _, name := range names {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return rep, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		n := 0
		for sc.Scan() {
			n++
			line := sc.Bytes()
			rep.Lines++
			bad := func(format string, a ...any) {
				rep.Problems = append(rep.Problems, Problem{File: name, Line: n, What: fmt.Sprintf(format, a...)})
			}
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				bad("not an audit record (%v): the line was changed", err)
				seq, prev = seq+1, lineHash(line)
				continue
			}
			if rep.First.IsZero() {
				rep.First = r.Time
			}
			rep.Last = r.Time
			switch {
			case r.Seq != seq+1 && r.Prev != prev:
				bad("line %d follows line %d and does not chain to it: lines before it were removed or reordered", r.Seq, seq)
			case r.Seq != seq+1:
				bad("line %d follows line %d: the sequence was changed", r.Seq, seq)
			case r.Prev != prev && n > 1:
				bad("does not chain to the line before (%s:%d): that line was changed", name, n-1)
			case r.Prev != prev:
				bad("does not chain to the last line of the file before: that file was changed or its tail removed")
			}
			if r.Kind == KindCheckpoint {
				rep.Checkpoints++
				rep.Unsealed = 0
				switch {
				case key == nil:
				case !hmac.Equal([]byte(r.MAC), []byte(mac(key, r.Seq, r.Prev))):
					bad("the checkpoint's MAC is not this host's key's: the stream before it was rewritten, or the key is another")
				}
			} else {
				rep.Unsealed++
			}
			seq, prev = r.Seq, lineHash(line)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return rep, fmt.Errorf("reading %s: %w", name, err)
		}
	}
	return rep, nil
}

// Manifest is a bundle's manifest.json.
type Manifest struct {
	Instance   string    `json:"instance"`
	ExportedAt time.Time `json:"exported_at"`
	Since      time.Time `json:"since,omitzero"`
	// Start is where the bundle's stream begins.
	Start Anchor `json:"start"`
	// Files are the stream's files in order, with their SHA-256.
	Files []BundleFile `json:"files"`
	// Policy is the allowlist in force at export (PolicyFile) and its hash.
	PolicyFile   string `json:"policy_file"`
	PolicySHA256 string `json:"policy_sha256"`
	// KeyFile is the checkpoint key, when it was exported with the stream.
	KeyFile string `json:"key_file,omitempty"`
}

// BundleFile is one file of a bundle.
type BundleFile struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// ManifestName, PolicyName and BundleKeyName are a bundle's own files.
const (
	ManifestName  = "manifest.json"
	PolicyName    = "allowlist.txt"
	BundleKeyName = "audit.key"
)

// ExportConfig says what Export writes.
type ExportConfig struct {
	Instance string
	// Dir is the stream's directory; Out the bundle's, which must not exist.
	Dir, Out string
	// Since leaves out the files whose every line is older; zero: all.
	Since time.Time
	// Policy is the allowlist text in force.
	Policy []byte
	// Key is the host's checkpoint key, with which the stream is verified
	// before it is exported; IncludeKey also writes it into the bundle so
	// that another machine can check the checkpoints (whoever holds the
	// bundle can then forge them: hand it on only to those who verify).
	Key        []byte
	IncludeKey bool
	Now        func() time.Time
}

// Export writes a bundle (the stream's files from Since on, the policy in
// force and its hash, the manifest) into a new directory, after verifying
// the stream: a stream with problems is not exported as evidence. On any
// error the directory is removed.
func Export(c ExportConfig) (m Manifest, err error) {
	rep, err := Verify(c.Dir, c.Key, Anchor{})
	if err != nil {
		return m, err
	}
	if !rep.OK() {
		return m, fmt.Errorf("the audit stream does not verify (%s): run abox audit verify", rep.Problems[0])
	}
	if err := os.Mkdir(c.Out, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return m, fmt.Errorf("bundle directory %s exists: name a new one", c.Out)
		}
		return m, fmt.Errorf("creating the bundle: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(c.Out)
		}
	}()
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	m = Manifest{Instance: c.Instance, ExportedAt: now().UTC(), Since: c.Since, PolicyFile: PolicyName}
	started := false
	for _, name := range rep.Files {
		b, err := os.ReadFile(filepath.Join(c.Dir, name))
		if err != nil {
			return m, err
		}
		if !started {
			first, last := fileSpan(b)
			if !c.Since.IsZero() && last.Time.Before(c.Since) && name != FileName {
				continue
			}
			started = true
			m.Start = Anchor{Seq: first.Seq, Prev: first.Prev}
		}
		if err := fsutil.WriteFileAtomic(filepath.Join(c.Out, name), b, 0o600); err != nil {
			return m, err
		}
		h := sha256.Sum256(b)
		m.Files = append(m.Files, BundleFile{Name: name, SHA256: hex.EncodeToString(h[:])})
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(c.Out, PolicyName), c.Policy, 0o600); err != nil {
		return m, err
	}
	ph := sha256.Sum256(c.Policy)
	m.PolicySHA256 = hex.EncodeToString(ph[:])
	if c.IncludeKey {
		if err := fsutil.WriteFileAtomic(filepath.Join(c.Out, BundleKeyName), c.Key, 0o600); err != nil {
			return m, err
		}
		m.KeyFile = BundleKeyName
	}
	mb, _ := json.MarshalIndent(m, "", "  ")
	if err := fsutil.WriteFileAtomic(filepath.Join(c.Out, ManifestName), append(mb, '\n'), 0o600); err != nil {
		return m, err
	}
	return m, nil
}

// fileSpan returns the first and last records of a file's bytes.
func fileSpan(b []byte) (first, last Record) {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	json.Unmarshal(lines[0], &first)
	json.Unmarshal(lines[len(lines)-1], &last)
	return first, last
}

// VerifyBundle checks a bundle written by Export wherever it now is: the
// files' hashes against the manifest, the policy's hash, and the chain
// from the manifest's start; the checkpoints with key, or with the
// bundle's own key when key is nil and it has one.
func VerifyBundle(dir string, key []byte) (Manifest, Report, error) {
	var m Manifest
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return m, Report{}, fmt.Errorf("not an audit bundle: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, Report{}, fmt.Errorf("bundle manifest: %w", err)
	}
	if key == nil && m.KeyFile != "" {
		if key, err = os.ReadFile(filepath.Join(dir, m.KeyFile)); err != nil {
			return m, Report{}, fmt.Errorf("bundle key: %w", err)
		}
	}
	rep, err := Verify(dir, key, m.Start)
	if err != nil {
		return m, rep, err
	}
	listed := map[string]bool{}
	for _, f := range m.Files {
		listed[f.Name] = true
		data, err := os.ReadFile(filepath.Join(dir, f.Name))
		if err != nil {
			rep.Problems = append(rep.Problems, Problem{File: f.Name, What: "listed in the manifest but missing"})
			continue
		}
		if h := sha256.Sum256(data); hex.EncodeToString(h[:]) != f.SHA256 {
			rep.Problems = append(rep.Problems, Problem{File: f.Name, What: "its SHA-256 is not the manifest's: the file was changed"})
		}
	}
	for _, f := range rep.Files {
		if !listed[f] {
			rep.Problems = append(rep.Problems, Problem{File: f, What: "not in the manifest: the file was added"})
		}
	}
	pol, err := os.ReadFile(filepath.Join(dir, m.PolicyFile))
	if err != nil {
		rep.Problems = append(rep.Problems, Problem{File: m.PolicyFile, What: "the policy is missing"})
	} else if h := sha256.Sum256(pol); hex.EncodeToString(h[:]) != m.PolicySHA256 {
		rep.Problems = append(rep.Problems, Problem{File: m.PolicyFile, What: "its SHA-256 is not the manifest's: the policy was changed"})
	}
	return m, rep, nil
}
