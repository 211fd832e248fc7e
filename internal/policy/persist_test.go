package policy

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/fsutil"
)

// TestChangeInForceWhenDiskFails: an allowlist change takes effect in memory
// first, whatever the disk does. With the file unwritable (a full disk) a
// removed entry is blocked at once, stays blocked across reloads that would
// read the old file, Status says the change is unsaved, and once the disk
// works again the next reload saves it. (The full disk is simulated by the
// write function: root ignores permissions, and filling a file system is
// not a unit test.)
func TestChangeInForceWhenDiskFails(t *testing.T) {
	e := newEngine(t, "keep.example.com\ngone.example.com\n")
	full := func(string, []byte, fs.FileMode) error {
		return &fs.PathError{Op: "write", Path: e.Path(), Err: syscall.ENOSPC}
	}
	e.writeFile = full
	_, err := e.Remove("gone.example.com")
	var ue *UnsavedError
	if !errors.As(err, &ue) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Remove on a full disk = %v, want an UnsavedError wrapping ENOSPC", err)
	}
	check := func(when string) {
		t.Helper()
		if d := e.Decide("gone.example.com"); d.Verdict != allowlist.Block {
			t.Errorf("%s: removed entry still %s", when, d.Verdict)
		}
		if d := e.Decide("keep.example.com"); d.Verdict != allowlist.Allow {
			t.Errorf("%s: kept entry %s", when, d.Verdict)
		}
	}
	check("after the failed write")
	if st := e.Status(); !strings.Contains(st.Unsaved, "no space") || st.UnsavedAt.IsZero() {
		t.Errorf("status %+v, want the unsaved change reported", st)
	}
	if err := e.Reload(); err == nil {
		t.Errorf("Reload with the disk still full succeeded")
	}
	check("after a reload with the disk still full")
	// A later edit builds on the change in force, not on the stale file.
	if _, err := e.Add("new.example.com"); !errors.As(err, &ue) {
		t.Fatalf("Add on a full disk = %v, want an UnsavedError", err)
	}
	if d := e.Decide("new.example.com"); d.Verdict != allowlist.Allow {
		t.Errorf("added entry not in force")
	}
	check("after an add")

	e.writeFile = fsutil.WriteFileAtomic
	if err := e.Reload(); err != nil {
		t.Fatalf("Reload once the disk works: %v", err)
	}
	check("after the disk recovered")
	data, _ := os.ReadFile(e.Path())
	if strings.Contains(string(data), "gone.example.com") || !strings.Contains(string(data), "new.example.com") {
		t.Errorf("file after recovery:\n%s\nwant the removal and the addition saved", data)
	}
	if st := e.Status(); st.Unsaved != "" {
		t.Errorf("status %+v, want nothing unsaved", st)
	}
}

// TestUserEditWinsOverUnsavedChange: if the user edits the file while a
// change is unsaved, the edit is the latest word and a reload reads it.
func TestUserEditWinsOverUnsavedChange(t *testing.T) {
	e := newEngine(t, "a.example.com\nb.example.com\n")
	e.writeFile = func(string, []byte, fs.FileMode) error { return syscall.EROFS }
	if _, err := e.Remove("a.example.com"); err == nil {
		t.Fatal("Remove succeeded on a read-only file system")
	}
	if err := os.WriteFile(e.Path(), []byte("c.example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Reload(); err != nil {
		t.Fatalf("Reload of the user's edit: %v", err)
	}
	for n, want := range map[string]allowlist.Verdict{"a.example.com": allowlist.Block, "b.example.com": allowlist.Block, "c.example.com": allowlist.Allow} {
		if d := e.Decide(n); d.Verdict != want {
			t.Errorf("%s = %s, want %s", n, d.Verdict, want)
		}
	}
}

// TestReplaceInForceWhenDiskFails: a whole-list edit (abox allowlist edit)
// is in force at once even when the file cannot be written, the next edit
// starts from it, and an edit based on a stale text changes nothing.
func TestReplaceInForceWhenDiskFails(t *testing.T) {
	e := newEngine(t, "old.example.com\n")
	e.writeFile = func(string, []byte, fs.FileMode) error { return syscall.ENOSPC }
	orig, err := e.Text()
	if err != nil {
		t.Fatal(err)
	}
	var ue *UnsavedError
	if err := e.Replace(orig, []byte("new.example.com\n")); !errors.As(err, &ue) {
		t.Fatalf("Replace on a full disk = %v, want an UnsavedError", err)
	}
	if e.Decide("old.example.com").Verdict != allowlist.Block || e.Decide("new.example.com").Verdict != allowlist.Allow {
		t.Errorf("the edit is not in force")
	}
	if txt, _ := e.Text(); string(txt) != "new.example.com\n" {
		t.Errorf("Text = %q, want the edit in force", txt)
	}
	if err := e.Replace(orig, []byte("stale.example.com\n")); !errors.Is(err, ErrChanged) {
		t.Errorf("Replace from a stale text = %v, want ErrChanged", err)
	}
	if e.Decide("stale.example.com").Verdict != allowlist.Block {
		t.Errorf("a stale edit was applied")
	}
	if err := e.Replace([]byte("new.example.com\n"), []byte("*\n")); err == nil || e.Decide("new.example.com").Verdict != allowlist.Allow {
		t.Errorf("an invalid edit = %v, want refused and nothing changed", err)
	}
}
