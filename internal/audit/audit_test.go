package audit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var testKey = bytes.Repeat([]byte{7}, 32)

// writeStream appends n decision lines to a stream in dir, in batches of
// three as a decision log's flusher hands them over, and closes it.
func writeStream(t *testing.T, dir string, n int, maxBytes int64) {
	t.Helper()
	s, err := Open(Config{Dir: dir, Key: testKey, MaxBytes: maxBytes, CheckpointEvery: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 3 {
		var b bytes.Buffer
		for j := i; j < i+3 && j < n; j++ {
			fmt.Fprintf(&b, `{"msg":"dns","name":"n%d.example","verdict":"allow"}`+"\n", j)
		}
		if _, err := s.Write(b.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Append(KindPolicy, map[string]string{"old": "a", "new": "b"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}

func writeLines(t *testing.T, path string, lines []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustVerify(t *testing.T, dir string) Report {
	t.Helper()
	rep, err := Verify(dir, testKey, Anchor{})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// wantProblemAt: Verify reports a problem at file:line first.
func wantProblemAt(t *testing.T, rep Report, file string, line int) {
	t.Helper()
	if rep.OK() {
		t.Fatalf("Verify found nothing, want a problem at %s:%d", file, line)
	}
	if p := rep.Problems[0]; p.File != file || p.Line != line {
		t.Errorf("first problem %s, want one at %s:%d (all: %v)", p, file, line, rep.Problems)
	}
}

func TestIntactStreamVerifies(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 20, 0)
	rep := mustVerify(t, dir)
	if !rep.OK() {
		t.Fatalf("an untouched stream has problems: %v", rep.Problems)
	}
	// 20 decisions, the policy line, a checkpoint after every 4 and at Close.
	if rep.Lines != 27 || rep.Checkpoints != 6 || rep.Unsealed != 0 {
		t.Errorf("lines %d checkpoints %d unsealed %d, want 27, 6, 0", rep.Lines, rep.Checkpoints, rep.Unsealed)
	}
	// A second writer (another process's Stream) continues the chain.
	writeStream(t, dir, 2, 0)
	if rep := mustVerify(t, dir); !rep.OK() || rep.Lines != 27+4 {
		t.Errorf("after a second writer: %d lines, problems %v", rep.Lines, rep.Problems)
	}
}

func TestEditedLineIsFound(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 20, 0)
	path := filepath.Join(dir, FileName)
	lines := readLines(t, path)
	lines[6] = strings.Replace(lines[6], `"verdict":"allow"`, `"verdict":"block"`, 1)
	writeLines(t, path, lines)
	rep := mustVerify(t, dir)
	wantProblemAt(t, rep, FileName, 8)
	if !strings.Contains(rep.Problems[0].What, FileName+":7") {
		t.Errorf("problem %q does not name the changed line", rep.Problems[0].What)
	}
}

func TestRemovedLineIsFound(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 20, 0)
	path := filepath.Join(dir, FileName)
	lines := readLines(t, path)
	writeLines(t, path, append(lines[:9:9], lines[10:]...))
	wantProblemAt(t, mustVerify(t, dir), FileName, 10)
}

func TestReorderedLinesAreFound(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 20, 0)
	path := filepath.Join(dir, FileName)
	lines := readLines(t, path)
	lines[2], lines[3] = lines[3], lines[2]
	writeLines(t, path, lines)
	wantProblemAt(t, mustVerify(t, dir), FileName, 3)
}

// Whoever rewrites the chain after an edit (recomputing every hash) still
// cannot make the next checkpoint's MAC without the key.
func TestRechainedEditFailsTheCheckpoint(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 20, 0)
	path := filepath.Join(dir, FileName)
	lines := readLines(t, path)
	prev := ""
	var out []string
	for i, l := range lines {
		var r Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			r.Data = json.RawMessage(`{"msg":"dns","name":"innocent.example","verdict":"allow"}`)
		}
		r.Prev = prev
		b, _ := json.Marshal(r)
		out = append(out, string(b))
		prev = lineHash(b)
	}
	writeLines(t, path, out)
	rep := mustVerify(t, dir)
	wantProblemAt(t, rep, FileName, 5) // the first checkpoint after the edit
	if !strings.Contains(rep.Problems[0].What, "MAC") {
		t.Errorf("problem %q, want the checkpoint's MAC", rep.Problems[0].What)
	}
}

// Rotation keeps the chain: each new file's first line chains to the old
// file's last; a rotated file edited, or removed, is caught.
func TestRotatedStream(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 60, 1024)
	names, _, _ := Files(dir)
	if len(names) < 3 {
		t.Fatalf("files %v, want rotations", names)
	}
	if rep := mustVerify(t, dir); !rep.OK() {
		t.Fatalf("a rotated stream has problems: %v", rep.Problems)
	}
	first := readLines(t, filepath.Join(dir, names[1]))[0]
	var r Record
	json.Unmarshal([]byte(first), &r)
	if r.Kind != KindRotated || !strings.Contains(string(r.Data), names[0]) {
		t.Errorf("%s starts with %s, want a rotated record naming %s", names[1], first, names[0])
	}

	t.Run("edited", func(t *testing.T) {
		d := t.TempDir()
		copyDir(t, dir, d)
		p := filepath.Join(d, names[0])
		lines := readLines(t, p)
		last := len(lines) - 1
		lines[last] = strings.Replace(lines[last], `"kind":"checkpoint"`, `"kind":"checkpoint" `, 1)
		writeLines(t, p, lines)
		wantProblemAt(t, mustVerify(t, d), names[1], 1)
	})
	t.Run("removed", func(t *testing.T) {
		d := t.TempDir()
		copyDir(t, dir, d)
		os.Remove(filepath.Join(d, names[1]))
		rep := mustVerify(t, d)
		if rep.OK() || rep.Problems[0].File != names[1] || !strings.Contains(rep.Problems[0].What, "missing") {
			t.Errorf("problems %v, want %s missing", rep.Problems, names[1])
		}
	})
	t.Run("oldest removed", func(t *testing.T) {
		d := t.TempDir()
		copyDir(t, dir, d)
		os.Remove(filepath.Join(d, names[0]))
		wantProblemAt(t, mustVerify(t, d), names[1], 1)
	})
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	ents, _ := os.ReadDir(from)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(to, e.Name()), b, 0o600)
	}
}

// An export verifies from another directory, with the bundle's key; a
// changed file or policy in the bundle is caught; --since leaves old files
// out and still verifies from the manifest's anchor.
func TestExportVerifiesElsewhere(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 60, 1024)
	out := filepath.Join(t.TempDir(), "bundle")
	policy := []byte("example.com\n")
	if _, err := Export(ExportConfig{Instance: "dev", Dir: dir, Out: out, Policy: policy, Key: testKey, IncludeKey: true}); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.Rename(out, moved); err != nil {
		t.Fatal(err)
	}
	m, rep, err := VerifyBundle(moved, nil)
	if err != nil || !rep.OK() || rep.Checkpoints == 0 {
		t.Fatalf("bundle: %v, problems %v, %d checkpoints", err, rep.Problems, rep.Checkpoints)
	}
	if m.PolicySHA256 == "" || len(m.Files) < 3 {
		t.Errorf("manifest %+v", m)
	}
	os.WriteFile(filepath.Join(moved, PolicyName), []byte("*.com\n"), 0o600)
	if _, rep, _ := VerifyBundle(moved, nil); rep.OK() {
		t.Error("a changed policy in the bundle verifies")
	}
	if _, rep, _ := VerifyBundle(moved, bytes.Repeat([]byte{8}, 32)); rep.OK() {
		t.Error("a bundle verifies under another key")
	}

	// --since: only the newest files, anchored.
	names, _, _ := Files(dir)
	var last Record
	json.Unmarshal([]byte(readLines(t, filepath.Join(dir, names[len(names)-2]))[0]), &last)
	since := filepath.Join(t.TempDir(), "since")
	m, err = Export(ExportConfig{Instance: "dev", Dir: dir, Out: since, Policy: policy, Key: testKey, Since: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 1 || m.Files[0].Name != FileName || m.Start.Seq <= 1 {
		t.Errorf("since the future: files %v start %+v, want the active file only, anchored", m.Files, m.Start)
	}
	if _, rep, err := VerifyBundle(since, testKey); err != nil || !rep.OK() {
		t.Errorf("a --since bundle: %v %v", err, rep.Problems)
	}
	if _, err := Export(ExportConfig{Instance: "dev", Dir: dir, Out: since, Policy: policy, Key: testKey}); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("export into an existing directory: %v", err)
	}
}

func TestLoadKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", KeyFile)
	k1, err := LoadKey(path)
	if err != nil || len(k1) != 32 {
		t.Fatalf("LoadKey: %v (%d bytes)", err, len(k1))
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %o, want 600", fi.Mode().Perm())
	}
	k2, _ := LoadKey(path)
	if !bytes.Equal(k1, k2) {
		t.Error("a second LoadKey made another key")
	}
	os.Chmod(path, 0o644)
	if _, err := LoadKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a key readable by others: %v", err)
	}
}

// A last line cut short (a crash mid-write) does not stop the stream: the
// next writer goes on after it, and Verify names that line only.
func TestTornLastLine(t *testing.T) {
	dir := t.TempDir()
	writeStream(t, dir, 5, 0)
	path := filepath.Join(dir, FileName)
	b, _ := os.ReadFile(path)
	torn := len(readLines(t, path))
	os.WriteFile(path, append(b, []byte(`{"seq":99,"prev":"ab`)...), 0o600)
	writeStream(t, dir, 2, 0)
	rep := mustVerify(t, dir)
	if len(rep.Problems) != 1 || rep.Problems[0].Line != torn+1 {
		t.Errorf("problems %v, want one, at the torn line %s:%d", rep.Problems, FileName, torn+1)
	}
}

// BenchmarkWrite is the audit stream's cost per decision line, in the
// decision log's flusher: a batch of 100 typical DNS lines per op.
func BenchmarkWrite(b *testing.B) {
	s, err := Open(Config{Dir: b.TempDir(), Key: testKey})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	line := `{"time":"2026-12-04T21:00:00.123456789Z","level":"INFO","msg":"dns","client":"10.10.7.2","name":"registry.npmjs.org","type":"A","verdict":"allow","reason":"allowlisted","rule":"registry.npmjs.org","rcode":"NOERROR","upstream_ms":0,"cached":true}` + "\n"
	batch := []byte(strings.Repeat(line, 100))
	b.SetBytes(int64(len(batch)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Write(batch); err != nil {
			b.Fatal(err)
		}
	}
}
