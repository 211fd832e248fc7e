package policy

import (
	"fmt"
	"os"
	"testing"
)

// TestAddRemovePushLines: a push line is added beside a name's request
// rules (no conflict: it holds pushes, it allows nothing), and removed by
// its line alone, leaving the name and its rules.
func TestAddRemovePushLines(t *testing.T) {
	e := newEngine(t, "git.example.org GET /**\n")
	added, err := e.Add("git.example.org push refs/heads/agent/*")
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(added) != "[git.example.org push refs/heads/agent/*]" {
		t.Errorf("added = %v", added)
	}
	if got := e.List().Push("git.example.org").String(); got != "refs/heads/agent/*" {
		t.Errorf("push rules in force = %q", got)
	}
	if added, err := e.Add("git.example.org push refs/heads/agent/*"); err != nil || len(added) != 0 {
		t.Errorf("adding it again: %v %v, want nothing added", added, err)
	}
	if _, err := e.Remove("git.example.org push refs/heads/agent/*"); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(e.Path()); string(data) != "git.example.org GET /**\n" {
		t.Errorf("file after remove:\n%s", data)
	}
	if e.List().Push("git.example.org") != nil {
		t.Errorf("push rules still in force after their line went")
	}
}
