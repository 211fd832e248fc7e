package gitpush

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzRead: Read never panics, never reads past its bound, and a request
// it returns without error is one whose every command it read: the bytes
// it consumed are a prefix of the body ending in the flush that ends the
// command list, and parsing exactly those bytes gives the same commands.
// The oracle re-reads the section with a simple splitter of its own.
func FuzzRead(f *testing.F) {
	f.Add([]byte(body(oidA+" "+oidB+" refs/heads/agent/x\x00"+caps, "0000") + "PACK"))
	f.Add([]byte(body("shallow "+oidA, zero+" "+oidB+" refs/heads/a\x00"+caps, oidA+" "+zero+" refs/tags/v\n", "0000")))
	f.Add([]byte("0000"))
	f.Add([]byte(body(zero2+" "+oidA2+" refs/heads/a\x00report-status object-format=sha256", "0000")))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, raw, err := Read(bytes.NewReader(b))
		if len(raw) > MaxSectionBytes || !bytes.HasPrefix(b, raw) {
			t.Fatalf("consumed %d bytes not a bounded prefix of the body", len(raw))
		}
		if err != nil {
			if len(req.Commands) != 0 {
				t.Fatalf("error %v with commands %v", err, req.Commands)
			}
			return
		}
		// The oracle: split raw into pkt-lines; it must end at its first
		// flush, and every non-shallow line must be a command Read returned.
		var got []string
		rest := raw
		for {
			if len(rest) < 4 {
				t.Fatalf("section %q does not end in a flush", raw)
			}
			if string(rest[:4]) == "0000" {
				if len(rest) != 4 {
					t.Fatalf("read %d bytes past the flush", len(rest)-4)
				}
				break
			}
			var n int
			for _, c := range rest[:4] {
				n = n*16 + strings.IndexByte("0123456789abcdef", c)
			}
			line := string(rest[4:n])
			rest = rest[n:]
			if strings.HasPrefix(line, "shallow ") && len(got) == 0 {
				continue
			}
			line, _, _ = strings.Cut(strings.TrimSuffix(line, "\n"), "\x00")
			got = append(got, line)
		}
		if len(got) != len(req.Commands) {
			t.Fatalf("%d command lines, Read returned %d", len(got), len(req.Commands))
		}
		for i, c := range req.Commands {
			if s := c.Old + " " + c.New + " " + c.Ref; s != got[i] {
				t.Fatalf("command %d: %q, line %q", i, s, got[i])
			}
			if CheckRefName(c.Ref) != nil || len(c.Old) != req.OIDLen {
				t.Fatalf("accepted %q", got[i])
			}
		}
	})
}
