package policy

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"github.com/abox-dev/abox/internal/allowlist"
)

// unsavedChange is an allowlist edit in force in memory whose file write
// failed (a full disk, a read-only file system).
type unsavedChange struct {
	// data is the file content the list in force was parsed from.
	data []byte
	// disk is what the file held when the write failed: a file that
	// differs from it later was edited by the user, whose edit then wins.
	disk []byte
	err  error
}

// UnsavedError reports an allowlist change that is in force but could not
// be written to the file.
type UnsavedError struct {
	Path string
	Err  error
}

func (e *UnsavedError) Error() string {
	return fmt.Sprintf("the allowlist change is in force, but writing %s failed: %v; it is lost when the filters restart unless the file can be written (free space, then run `abox allowlist reload`, which saves it)", e.Path, e.Err)
}

func (e *UnsavedError) Unwrap() error { return e.Err }

// baseLocked returns the allowlist text an edit starts from, and its list:
// the unsaved change in force if there is one, else the file.
func (e *Engine) baseLocked() ([]byte, *allowlist.List, error) {
	if e.unsaved != nil {
		return e.unsaved.data, e.list.Load(), nil
	}
	data, err := os.ReadFile(e.path)
	if err != nil {
		return nil, nil, err
	}
	l, err := allowlist.Parse(bytes.NewReader(data), e.path)
	if err != nil {
		return nil, nil, fmt.Errorf("fix the file first: %w", err)
	}
	return data, l, nil
}

// applyLocked puts the list parsed from data in force at once, then writes
// data to the file. Enforcement never waits for the disk: if the write
// fails, the change stays in force, Status says it is unsaved, and the
// next reload tries the write again before it reads the file.
func (e *Engine) applyLocked(trigger string, data []byte) error {
	l, err := allowlist.Parse(bytes.NewReader(data), e.path)
	if err == nil {
		err = e.checkList(l)
	}
	if err != nil {
		return fmt.Errorf("applying allowlist %s: %w", trigger, err)
	}
	prev := e.status.Load()
	old := e.list.Swap(l)
	e.changed(trigger, old, l)
	st := &ReloadStatus{Path: e.path, Entries: l.Len(), LoadedAt: e.now(), Reloads: prev.Reloads + 1}
	if werr := e.writeLocked(data); werr != nil {
		disk, _ := os.ReadFile(e.path)
		e.unsaved = &unsavedChange{data: data, disk: disk, err: werr}
		st.Unsaved, st.UnsavedAt = werr.Error(), e.now()
		e.status.Store(st)
		e.log.Error("allowlist change in force but not saved", "trigger", trigger, "path", e.path, "entries", l.Len(), "error", werr.Error())
		return &UnsavedError{Path: e.path, Err: werr}
	}
	e.unsaved = nil
	e.status.Store(st)
	e.log.Info("allowlist changed", "trigger", trigger, "path", e.path, "entries", l.Len())
	return nil
}

// resaveLocked runs before a reload while a change is unsaved: it writes the
// change now, so that reading the file does not bring back what the change
// removed. A file the user has edited since the failed write is theirs: it
// is read as is.
func (e *Engine) resaveLocked() error {
	u := e.unsaved
	if u == nil {
		return nil
	}
	if disk, err := os.ReadFile(e.path); err == nil && !bytes.Equal(disk, u.disk) {
		e.unsaved = nil
		return nil
	}
	if werr := e.writeLocked(u.data); werr != nil {
		st := *e.status.Load()
		st.Unsaved, st.UnsavedAt = werr.Error(), e.now()
		e.status.Store(&st)
		return &UnsavedError{Path: e.path, Err: werr}
	}
	e.unsaved = nil
	return nil
}

// ErrChanged: the allowlist in force is no longer the text an edit started from.
var ErrChanged = errors.New("the allowlist changed while it was being edited")

// Text returns the allowlist text in force: the unsaved change if there is
// one, else the file.
func (e *Engine) Text() ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.textLocked()
}

func (e *Engine) textLocked() ([]byte, error) {
	if e.unsaved != nil {
		return e.unsaved.data, nil
	}
	data, err := os.ReadFile(e.path)
	if err != nil {
		return nil, fmt.Errorf("reading allowlist: %w", err)
	}
	return data, nil
}

// Replace puts data in force as the whole allowlist (abox allowlist edit),
// like Add and Remove: in memory first, then in the file. It refuses, and
// changes nothing, when data has an invalid line or when the text in force
// is no longer expected (ErrChanged).
func (e *Engine) Replace(expected, data []byte) error {
	if _, err := allowlist.Parse(bytes.NewReader(data), e.path); err != nil {
		return fmt.Errorf("replacing allowlist: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	cur, err := e.textLocked()
	if err != nil {
		return err
	}
	if !bytes.Equal(cur, expected) {
		return ErrChanged
	}
	return e.applyLocked("edit", data)
}
