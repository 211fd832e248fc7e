// Package gitpush reads the ref-update commands at the start of a git
// smart-HTTP push (a POST to git-receive-pack) and decides them by push
// rules, so that a proxy can hold a push to some refs before any pack
// data goes upstream.
package gitpush

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Bounds of the command section. git sends one pkt-line per ref, and no
// pkt-line is longer than MaxPktLen; the section as a whole is bounded so
// that a push is decided from memory the proxy can afford.
const (
	// MaxPktLen is the largest pkt-line, its 4-byte length included
	// (gitprotocol-common: LARGE_PACKET_MAX).
	MaxPktLen = 65520
	// MaxCommands bounds the ref updates of one push.
	MaxCommands = 1000
	// MaxShallow bounds the shallow lines before the commands.
	MaxShallow = 1000
	// MaxRefLen bounds a ref name.
	MaxRefLen = 1024
	// MaxSectionBytes bounds everything read before the pack.
	MaxSectionBytes = 1 << 20
)

// Kind is what a command does to its ref.
type Kind string

const (
	Create Kind = "create"
	Update Kind = "update"
	Delete Kind = "delete"
)

// Command is one ref update: "<old-oid> <new-oid> <refname>".
type Command struct {
	Old, New string // lowercase hex, of the request's object format
	Ref      string // a full ref name, refs/...
}

// Kind says whether c creates, updates or deletes its ref (a zero old oid
// creates, a zero new oid deletes).
func (c Command) Kind() Kind {
	switch {
	case isZero(c.Old):
		return Create
	case isZero(c.New):
		return Delete
	}
	return Update
}

func isZero(oid string) bool { return strings.Trim(oid, "0") == "" }

// Request is the command section of a push.
type Request struct {
	// Commands in the order sent; none for a probe (a flush alone, which
	// git sends before a large push to check credentials).
	Commands []Command
	// Caps are the capabilities the client asked for on its first
	// command, as sent ("agent=git/2.39.5" included).
	Caps []string
	// OIDLen is 40 (SHA-1) or 64 (SHA-256).
	OIDLen int
}

// Has reports whether the client asked for the capability name (a bare
// word, or the name before "=").
func (r *Request) Has(name string) bool {
	for _, c := range r.Caps {
		if c == name || strings.HasPrefix(c, name+"=") {
			return true
		}
	}
	return false
}

// ErrUnreadable is wrapped by every error of Read about the body itself
// (as against the reader failing).
var ErrUnreadable = errors.New("git push request not understood")

// ErrRefused is wrapped by Read's errors for a request that is well formed
// but carries what no push rule can judge (push options, a signed push).
var ErrRefused = errors.New("git push request cannot be judged")

// knownCaps are the capabilities a client may ask for on a push that do
// not change which refs it updates (gitprotocol-capabilities). Any other
// is refused: what it means is unknown, so the decision could be wrong.
var knownCaps = map[string]bool{
	"report-status": true, "report-status-v2": true, "side-band": true, "side-band-64k": true,
	"quiet": true, "atomic": true, "ofs-delta": true, "delete-refs": true, "no-thin": true,
	"agent": true, "object-format": true, "session-id": true,
}

// Read reads the command section of a receive-pack request body: optional
// shallow lines, the commands ended by a flush-pkt. It reads no byte past
// that flush (nor past MaxSectionBytes), and returns every byte it read,
// so that the caller can send them upstream ahead of the rest. Only a nil
// error means the command list was read whole, to its flush; with an
// error the request holds no commands, only the capabilities read, which
// say how the client expects to be answered (Refusal).
func Read(r io.Reader) (*Request, []byte, error) {
	var raw bytes.Buffer
	lr := &io.LimitedReader{R: r, N: MaxSectionBytes}
	rd := io.TeeReader(lr, &raw)
	req := &Request{OIDLen: 40}
	shallow := 0
	for first := true; ; {
		line, flush, err := readPkt(rd)
		if err != nil {
			if lr.N == 0 {
				err = fmt.Errorf("%w: the commands are longer than %d bytes", ErrUnreadable, MaxSectionBytes)
			}
			return req.failed(), raw.Bytes(), err
		}
		if flush {
			return req, raw.Bytes(), nil
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if first && bytes.HasPrefix(line, []byte("shallow ")) {
			if shallow++; shallow > MaxShallow {
				return req.failed(), raw.Bytes(), fmt.Errorf("%w: more than %d shallow lines", ErrUnreadable, MaxShallow)
			}
			continue // a shallow client's boundary: no ref is named
		}
		if first && bytes.HasPrefix(line, []byte("push-cert")) {
			return req.failed(), raw.Bytes(), fmt.Errorf("%w: a signed push (push-cert); push without --signed", ErrRefused)
		}
		if first {
			cmd, caps, ok := bytes.Cut(line, []byte{0})
			if !ok {
				return req.failed(), raw.Bytes(), fmt.Errorf("%w: the first command has no capabilities", ErrUnreadable)
			}
			if err := req.setCaps(string(caps)); err != nil {
				return req.failed(), raw.Bytes(), err
			}
			line = cmd
			first = false
		}
		if len(req.Commands) == MaxCommands {
			return req.failed(), raw.Bytes(), fmt.Errorf("%w: more than %d ref updates in one push", ErrRefused, MaxCommands)
		}
		c, err := parseCommand(string(line), req.OIDLen)
		if err != nil {
			return req.failed(), raw.Bytes(), err
		}
		req.Commands = append(req.Commands, c)
	}
}

// failed is req after an error: its capabilities, no command.
func (req *Request) failed() *Request {
	return &Request{Caps: req.Caps, OIDLen: req.OIDLen}
}

func (req *Request) setCaps(s string) error {
	req.Caps = strings.Fields(s)
	for _, c := range req.Caps {
		name, val, _ := strings.Cut(c, "=")
		switch {
		case name == "push-options":
			return fmt.Errorf("%w: push options (-o, --push-option) reach the server's hooks, which may act on other refs; push without them", ErrRefused)
		case !knownCaps[name]:
			return fmt.Errorf("%w: unknown capability %q", ErrRefused, name)
		case name == "object-format" && val == "sha1":
			req.OIDLen = 40
		case name == "object-format" && val == "sha256":
			req.OIDLen = 64
		case name == "object-format":
			return fmt.Errorf("%w: unknown object format %q", ErrRefused, val)
		}
	}
	return nil
}

// readPkt reads one pkt-line: its payload, or flush for "0000".
func readPkt(r io.Reader) (payload []byte, flush bool, err error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, false, fmt.Errorf("%w: the body ends before the flush that ends the commands", ErrUnreadable)
	}
	n := 0
	for _, b := range h {
		var d int
		switch {
		case b >= '0' && b <= '9':
			d = int(b - '0')
		case b >= 'a' && b <= 'f':
			d = int(b-'a') + 10
		default:
			return nil, false, fmt.Errorf("%w: %q is no pkt-line length", ErrUnreadable, h[:])
		}
		n = n<<4 | d
	}
	switch {
	case n == 0:
		return nil, true, nil
	case n <= 4:
		// delim-pkt, response-end-pkt (protocol v2 only), or an empty line
		return nil, false, fmt.Errorf("%w: pkt-line %q among the commands", ErrUnreadable, h[:])
	case n > MaxPktLen:
		return nil, false, fmt.Errorf("%w: pkt-line of %d bytes, more than %d", ErrUnreadable, n, MaxPktLen)
	}
	p := make([]byte, n-4)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, false, fmt.Errorf("%w: the body ends inside a pkt-line", ErrUnreadable)
	}
	return p, false, nil
}

func parseCommand(s string, oidLen int) (Command, error) {
	old, rest, ok1 := strings.Cut(s, " ")
	nw, ref, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return Command{}, fmt.Errorf("%w: %q is no ref update (old-oid new-oid ref)", ErrUnreadable, trim(s))
	}
	if !isOID(old, oidLen) || !isOID(nw, oidLen) {
		return Command{}, fmt.Errorf("%w: %q: object ids are %d lowercase hex digits", ErrUnreadable, trim(s), oidLen)
	}
	if isZero(old) && isZero(nw) {
		return Command{}, fmt.Errorf("%w: %q: both object ids are zero", ErrUnreadable, trim(s))
	}
	if err := CheckRefName(ref); err != nil {
		return Command{}, fmt.Errorf("%w: %w", ErrUnreadable, err)
	}
	return Command{Old: old, New: nw, Ref: ref}, nil
}

func trim(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func isOID(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !(s[i] >= '0' && s[i] <= '9' || s[i] >= 'a' && s[i] <= 'f') {
			return false
		}
	}
	return true
}

// CheckRefName refuses a name git's check-ref-format would refuse, and any
// name outside refs/ (HEAD is never pushed by name): a rule decides names
// as git stores them, so one it would reject cannot be judged.
func CheckRefName(ref string) error {
	if len(ref) > MaxRefLen {
		return fmt.Errorf("ref name longer than %d bytes", MaxRefLen)
	}
	if !strings.HasPrefix(ref, "refs/") {
		return fmt.Errorf("ref %q is not under refs/", trim(ref))
	}
	for _, comp := range strings.Split(ref, "/") {
		if err := checkComponent(comp); err != nil {
			return fmt.Errorf("ref %q: %w", trim(ref), err)
		}
	}
	if strings.HasSuffix(ref, ".") || strings.Contains(ref, "@{") {
		return fmt.Errorf("ref %q is not a valid ref name (git check-ref-format)", trim(ref))
	}
	return nil
}

func checkComponent(c string) error {
	switch {
	case c == "":
		return errors.New("empty component (// or a trailing /)")
	case c[0] == '.':
		return errors.New("a component starts with .")
	case strings.HasSuffix(c, ".lock"):
		return errors.New("a component ends with .lock")
	case strings.Contains(c, ".."):
		return errors.New("contains ..")
	case c == "@":
		return errors.New("a component is @")
	}
	for i := 0; i < len(c); i++ {
		if b := c[i]; b < 0x20 || b == 0x7f || strings.IndexByte(" ~^:?*[\\", b) >= 0 {
			return fmt.Errorf("contains %q", b)
		}
	}
	return nil
}
