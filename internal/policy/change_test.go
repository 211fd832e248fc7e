package policy

import (
	"os"
	"path/filepath"
	"testing"
)

// Every change of the list or mode in force is reported once, with the
// hashes of the old and new lists; an edit that is refused is not.
func TestOnChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "allow.txt")
	os.WriteFile(path, []byte("a.example\n"), 0o600)
	var got []Change
	e, err := New(Config{AllowlistPath: path, OnChange: func(c Change) { got = append(got, c) }})
	if err != nil {
		t.Fatal(err)
	}
	h0 := ListHash(e.List())
	if _, err := e.Add("b.example"); err != nil {
		t.Fatal(err)
	}
	h1 := ListHash(e.List())
	if _, err := e.Add("*"); err == nil {
		t.Fatal("a bad line was added")
	}
	os.WriteFile(path, []byte("c.example\n"), 0o600)
	if err := e.Reload(); err != nil {
		t.Fatal(err)
	}
	e.SetMode(Passive)
	e.SetMode(Passive) // no change
	want := []Change{
		{Kind: "allowlist", Trigger: "add", Old: h0, New: h1, Entries: 2},
		{Kind: "allowlist", Trigger: "reload", Old: h1, New: ListHash(e.List()), Entries: 1},
		{Kind: "mode", Trigger: "mode", Old: "active", New: "passive"},
	}
	if len(got) != len(want) {
		t.Fatalf("changes %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("change %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if h0 == h1 {
		t.Error("two lists have one hash")
	}
}
