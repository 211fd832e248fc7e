package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/abox-dev/abox/internal/instance"
	"github.com/abox-dev/abox/internal/paths"
	"github.com/abox-dev/abox/internal/termtext"
)

// TestLogsAndJSONCannotDriveTheTerminal: decision-log lines carry what the
// guest asked for (a URL path may hold any UTF-8, the 8-bit CSI U+009B and
// bidirectional overrides included), and --json output carries guest text
// too; neither may reach the terminal as controls, and both stay JSON.
func TestLogsAndJSONCannotDriveTheTerminal(t *testing.T) {
	line := json.RawMessage(`{"host":"origin.test","path":"/` + "\u009b" + `2J` + "\u202e" + `txt.exe` + "\x7f" + `"}`)
	var out bytes.Buffer
	printLines(&out, []json.RawMessage{line})
	if err := termtext.Check(string(bytes.TrimSuffix(out.Bytes(), []byte("\n")))); err != nil {
		t.Errorf("logs print %q: %v", out.String(), err)
	}
	var v map[string]string
	if err := json.Unmarshal(out.Bytes(), &v); err != nil || v["path"] != "/\u009b2J\u202etxt.exe\x7f" {
		t.Errorf("logs line no longer means the same: %v %q", err, v["path"])
	}
	out.Reset()
	if err := writeJSON(&out, map[string]string{"error": "cloud-init: \u009b2J\u2066"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range out.String() {
		if termtext.Unsafe(r) && r != '\n' {
			t.Errorf("--json prints %U: %q", r, out.String())
		}
	}
}

// TestSSHCommandOutputOnATerminal: `abox ssh NAME -- COMMAND` runs without
// a tty of its own, so the guest's bytes would reach the operator's
// terminal as they are; on a terminal they are escaped, to a pipe they
// pass unchanged (tar c | tar x must keep working). ssh is stood in for by
// a program that prints what a hostile guest would.
func TestSSHCommandOutputOnATerminal(t *testing.T) {
	bin := t.TempDir()
	os.WriteFile(filepath.Join(bin, "ssh"), []byte("#!/bin/sh\nprintf 'out\\033]0;pwned\\007\\n'\nprintf 'err\\033[2J\\n' >&2\n"), 0o755)
	t.Setenv("PATH", bin+":"+os.Getenv("PATH"))
	l := paths.Layout{Root: t.TempDir()}
	saveState(t, l.Root, instance.State{Name: "dev", User: "abox", Gateway: netip.MustParseAddr("10.10.9.1")})
	key := l.Instance("dev").SSHKey
	os.MkdirAll(filepath.Dir(key), 0o700)
	os.WriteFile(key, []byte("key"), 0o600)

	master, slave := openPTY(t)
	e := &env{stdin: strings.NewReader(""), stdout: slave, stderr: slave, layout: func() (paths.Layout, error) { return l, nil }}
	root := newRootCmd(e)
	root.SetArgs([]string{"ssh", "dev", "--", "cat", "motd"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	got, _ := io.ReadAll(master)
	if bytes.ContainsAny(got, "\x1b\x07") || !bytes.Contains(got, []byte(`out\x1b]0;pwned\x07`)) || !bytes.Contains(got, []byte(`err\x1b[2J`)) {
		t.Errorf("on a terminal: %q", got)
	}

	var pipe bytes.Buffer
	e = &env{stdin: strings.NewReader(""), stdout: &pipe, stderr: &pipe, layout: func() (paths.Layout, error) { return l, nil }}
	root = newRootCmd(e)
	root.SetArgs([]string{"ssh", "dev", "--", "cat", "motd"})
	if err := root.ExecuteContext(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(pipe.Bytes(), []byte("out\x1b]0;pwned\x07\n")) {
		t.Errorf("to a pipe the bytes changed: %q", pipe.Bytes())
	}
}

// openPTY opens a pseudo-terminal pair.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Raw output: no newline translation on the way to the reader.
	tio, err := unix.IoctlGetTermios(int(s.Fd()), unix.TCGETS)
	if err == nil {
		tio.Oflag &^= unix.OPOST
		unix.IoctlSetTermios(int(s.Fd()), unix.TCSETS, tio)
	}
	t.Cleanup(func() { s.Close() })
	return m, s
}
