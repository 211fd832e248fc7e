//go:build e2e

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/abox-dev/abox/internal/cloudinit"
	"github.com/abox-dev/abox/internal/monitor"
)

// What TestTetragonAgent saw from the real agent (Tetragon v1.7-ff580d1 in
// a Debian 12 guest under TCG); its checks must pass on it and fail when
// the property they stand for is broken. No VM needed.
const (
	seenJournal = `Starting abox-tetragon.service - Tetragon, installed by abox: exec, sensitive-file and connect events for the host monitor...
level=info msg="Starting tetragon" version=v1.7-ff580d1
level=info msg="Listening for events..."
`
	seenKprobes = `ffffffff81445cd0  k  security_bprm_committing_creds+0x0    [FTRACE]
ffffffff81446ff0  k  security_file_permission+0x0    [FTRACE]
ffffffff810e2820  k  wake_up_new_task+0x0    [FTRACE]
ffffffff811734a0  k  acct_process+0x0    [FTRACE]
ffffffff81898c40  k  tcp_connect+0x0    [FTRACE]
`
	seenMarker = "abox-e2e-1796397486218091779"
)

func TestTetragonVersionCheck(t *testing.T) {
	if got, err := tetragonVersion(seenJournal, sharedBundleVersion); err != nil || got != "v1.7-ff580d1" {
		t.Errorf("the agent's journal: %q, %v", got, err)
	}
	if _, err := tetragonVersion(seenJournal, ""); err != nil {
		t.Errorf("any release: %v", err)
	}
	for name, c := range map[string]struct{ journal, want string }{
		"another version":     {seenJournal, "v1.7-0000000"},
		"no version":          {strings.ReplaceAll(seenJournal, " version=v1.7-ff580d1", ""), sharedBundleVersion},
		"not a release":       {strings.ReplaceAll(seenJournal, "version=v1.7-ff580d1", "version=devel"), ""},
		"no Starting line":    {strings.ReplaceAll(seenJournal, `msg="Starting tetragon"`, `msg="Starting fake"`), sharedBundleVersion},
		"only in the unit":    {"Starting tetragon v1.7-ff580d1\n", sharedBundleVersion},
		"an empty journal":    {"", ""},
		"a version elsewhere": {`level=info msg="config settings" version=v1.7-ff580d1` + "\n", sharedBundleVersion},
	} {
		if got, err := tetragonVersion(c.journal, c.want); err == nil {
			t.Errorf("%s: accepted (%q)", name, got)
		}
	}
}

func TestKprobeCheck(t *testing.T) {
	hooks := policyHooks(cloudinit.TetragonPolicies("abox"))
	if !slices.Equal(hooks, []string{"security_file_permission", "tcp_connect"}) {
		t.Fatalf("the policies hook %q", hooks)
	}
	if m := missingKprobes(seenKprobes, hooks); len(m) != 0 {
		t.Errorf("the agent's kprobes: missing %q", m)
	}
	if m := missingKprobes(seenKprobes, []string{"tcp_connect", "tcp_v4_connect"}); !slices.Equal(m, []string{"tcp_v4_connect"}) {
		t.Errorf("a function nothing hooks: missing %q", m)
	}
	noTCP := strings.ReplaceAll(seenKprobes, "tcp_connect+0x0", "tcp_close+0x0")
	if m := missingKprobes(noTCP, hooks); !slices.Equal(m, []string{"tcp_connect"}) {
		t.Errorf("without tcp_connect's kprobe: missing %q", m)
	}
	if m := missingKprobes("", hooks); len(m) != 2 {
		t.Errorf("no kprobes (the agent stopped): missing %q", m)
	}
	if m := missingKprobes("ffffffff81446ff0  k  security_file_permission_x+0x0\n", []string{"security_file_permission"}); len(m) != 1 {
		t.Errorf("a prefix is not the function: missing %q", m)
	}
	if m := missingKprobes("p:kprobes/a tcp_connect sk=%di\nr:kprobes/b security_file_permission+0\n", hooks); len(m) != 0 {
		t.Errorf("tracefs' kprobe_events: missing %q", m)
	}
}

func TestExecLinksCheck(t *testing.T) {
	b, err := os.ReadFile("testdata/tetragon-export.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	raw := string(b)
	uid := uint32(1000)
	host := monitor.Event{Kind: "process_exec", Process: &monitor.Proc{Binary: "/usr/bin/printf", PID: 601, UID: &uid}}
	if err := execLinks(raw, seenMarker, host); err != nil {
		t.Fatalf("the agent's events: %v", err)
	}
	const (
		printfID = "dGV0OjgwMTEwMTEwNzIzOjYwMQ==" // tet:80110110723:601
		shellID  = "dGV0OjgwMDQzMzI4MTAzOjYwMA==" // tet:80043328103:600
		sshdID   = "dGV0Ojc5OTcwNzQ1MzczOjU5OQ==" // the shell's parent
	)
	lines := strings.Split(strings.TrimSpace(raw), "\n")
	onPrintf := func(old, new string) string {
		l := slices.Clone(lines)
		l[1] = strings.ReplaceAll(l[1], old, new)
		return strings.Join(l, "\n")
	}
	otherHost := host
	otherHost.Process = &monitor.Proc{Binary: "/usr/bin/printf", PID: 602}
	for name, c := range map[string]struct {
		raw  string
		host monitor.Event
	}{
		"no exec ids (the stand-in's events)": {onPrintf(`"exec_id":"`+printfID+`",`, ""), host},
		"no parent_exec_id":                   {onPrintf(`"parent_exec_id":"`+shellID+`",`, ""), host},
		"an exec id in camel case":            {onPrintf(`"exec_id":"`+printfID+`"`, `"execId":"`+printfID+`"`), host},
		"an exec id of another pid":           {onPrintf(printfID, "dGV0OjgwMTEwMTEwNzIzOjYwMg=="), host},
		"an exec id of another node":          {onPrintf(printfID, "eHh4OjgwMTEwMTEwNzIzOjYwMQ=="), host},
		"an exec id that is not base64":       {onPrintf(printfID, "tet:80110110723:601"), host},
		"a parent_exec_id not the parent's":   {onPrintf(`"parent_exec_id":"`+shellID+`"`, `"parent_exec_id":"`+sshdID+`"`), host},
		"no exec event of the shell":          {strings.Join(lines[1:], "\n"), host},
		"no exec of printf":                   {onPrintf(`"binary":"/usr/bin/printf"`, `"binary":"/usr/bin/env"`), host},
		"printf without the marker":           {strings.ReplaceAll(raw, seenMarker, "abox-e2e-0"), host},
		"the host saw another process":        {raw, otherHost},
		"the host saw no process":             {raw, monitor.Event{Kind: "process_exec"}},
	} {
		if err := execLinks(c.raw, seenMarker, c.host); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestFindSharedBundle(t *testing.T) {
	// top/repo is the module (a clone or a worktree), top/shared/tetragon
	// the bundle beside it; the test runs in top/repo/e2e.
	top := t.TempDir()
	repo, pkg := filepath.Join(top, "repo"), filepath.Join(top, "repo", "e2e")
	os.MkdirAll(pkg, 0o755)
	os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module x\n"), 0o644)
	const name = "tetragon-test.tar.gz"
	const data = "a bundle"
	sum := sha256.Sum256([]byte(data))
	sha := hex.EncodeToString(sum[:])

	f, searched, err := findSharedBundle(pkg, name, sha)
	if f != "" || err != nil || !slices.Contains(searched, filepath.Join(top, "shared", "tetragon")) {
		t.Errorf("none there: %q %q %v", f, searched, err)
	}
	if slices.Contains(searched, filepath.Join(repo, "shared", "tetragon")) {
		t.Errorf("searched inside the module: %q", searched)
	}
	dir := filepath.Join(top, "shared", "tetragon")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, name), []byte(data), 0o444)
	for _, from := range []string{pkg, repo} {
		if f, _, err := findSharedBundle(from, name, sha); f != filepath.Join(dir, name) || err != nil {
			t.Errorf("from %s: %q %v", from, f, err)
		}
	}
	// A worktree one level deeper (top/wt/repo) still finds top/shared.
	deep := filepath.Join(top, "wt", "repo")
	os.MkdirAll(deep, 0o755)
	os.WriteFile(filepath.Join(deep, "go.mod"), []byte("module x\n"), 0o644)
	if f, _, err := findSharedBundle(deep, name, sha); f != filepath.Join(dir, name) || err != nil {
		t.Errorf("from a deeper module: %q %v", f, err)
	}
	// Another bundle under the name is refused, naming both digests.
	os.Chmod(filepath.Join(dir, name), 0o644)
	os.WriteFile(filepath.Join(dir, name), []byte("another bundle"), 0o644)
	if f, _, err := findSharedBundle(pkg, name, sha); f != "" || err == nil || !strings.Contains(err.Error(), sha) || !strings.Contains(err.Error(), "has sha256") {
		t.Errorf("a changed bundle: %q %v", f, err)
	}
	if _, _, err := findSharedBundle(t.TempDir(), name, sha); err == nil {
		t.Error("no module above: no error")
	}
}
