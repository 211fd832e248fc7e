package reqrules

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// ErrNotCanonical is wrapped by every error of Normalize and NormalizeQuery:
// the input has no canonical form, so no rule with a path can allow it.
var ErrNotCanonical = errors.New("no canonical form")

// PathError says why a path or query has no canonical form.
type PathError struct {
	// Input is what was given, cut at 128 bytes.
	Input string
	// Why is the reason in words.
	Why string
}

func (e *PathError) Error() string { return fmt.Sprintf("%q: %s", e.Input, e.Why) }

// Is makes errors.Is(err, ErrNotCanonical) hold.
func (e *PathError) Is(target error) bool { return target == ErrNotCanonical }

func notCanonical(in, format string, args ...any) error {
	if len(in) > 128 {
		in = in[:128]
	}
	return &PathError{Input: in, Why: fmt.Sprintf(format, args...)}
}

const upperHex = "0123456789ABCDEF"

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// unreserved is RFC 3986's ALPHA / DIGIT / "-" / "." / "_" / "~": the
// characters whose percent-encoded and plain forms are the same URI.
func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// plainInPath is what the canonical form writes unencoded besides the
// unreserved characters: RFC 3986's sub-delims, ":" and "@" (pchar) and the
// separator "/". Percent-encoded, these stay encoded: a server may give
// "%3B" and ";" different meanings, and RFC 3986 6.2.2.2 says they differ.
func plainInPath(c byte) bool {
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@', '/':
		return true
	}
	return unreserved(c)
}

func control(c byte) bool { return c < 0x20 || c == 0x7f }

// Normalize returns the one canonical form of an escaped request path (the
// bytes of the request-target before any "?", or url.URL.EscapedPath). It
// is the form rules are matched against and the form the proxy sends
// upstream, so a server sees exactly the path that was decided. The steps,
// in order:
//
//  1. An empty path is "/". Anything else must start with "/".
//  2. Percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are
//     decoded; every other escape is kept with upper-case hex digits. Raw
//     bytes that a path may not hold plainly (space, "<", "{", "|", bytes
//     of 0x80 and above, ...) are percent-encoded.
//  3. Empty segments are dropped ("a//b" is "a/b"), then "." and ".."
//     segments are removed as RFC 3986 5.2.4 does, encoded ones ("%2e")
//     included; a path that ended in "/", "." or ".." keeps a trailing "/".
//
// Paths that servers read in different ways are refused rather than
// rewritten, since no single rewrite is what every server would see:
// control characters (raw or encoded), a backslash or "%5C" (a separator to
// IIS and to some frameworks), "%00", "%25" followed by two hex digits
// (double encoding), bytes that do not decode to UTF-8 (overlong forms
// such as %C0%AE), C1 controls, non-ASCII characters whose compatibility
// form holds one of . / \ ; % ? # (fullwidth dots and slashes, which a
// server that applies NFKC reads as structure), and segments that turn
// into a dot segment or an empty one when a server drops ";parameters"
// (Tomcat, Jetty, Spring), or trailing dots and spaces (Windows): "..;x",
// ";x", "...", "%20". An encoded slash "%2F" is kept inside its segment,
// where it can only match "**" (see Rule), and the pieces it separates must
// be names by the same test, so that a server that decodes it before
// routing sees more segments but never a dot segment.
func Normalize(escaped string) (string, error) {
	if canonicalASCII(escaped) {
		// The common case, checked without allocating: the slow path
		// would return the same string (TestCanonicalFastPath).
		return escaped, nil
	}
	return normalize(escaped)
}

// canonicalASCII reports whether escaped is already in canonical form and
// simple: "/" then segments of plain characters only (no escape, nothing
// to encode), none empty but the last, none a dot segment, none whose
// name before ";" is empty or made of dots. Normalize returns such a path
// unchanged; anything else takes the long way.
func canonicalASCII(escaped string) bool {
	if escaped == "" || escaped[0] != '/' {
		return false
	}
	start := 1 // of the current segment
	for i := 1; i <= len(escaped); i++ {
		if i < len(escaped) {
			c := escaped[i]
			if c != '/' {
				if !plainInPath(c) {
					return false
				}
				continue
			}
		}
		seg := escaped[start:i]
		if seg == "" {
			if i < len(escaped) {
				return false // "//"
			}
			break // a trailing slash (or the root)
		}
		name := seg
		if j := strings.IndexByte(name, ';'); j >= 0 {
			name = name[:j]
		}
		if strings.Trim(name, ".") == "" {
			return false // ".", "..", "...", ";x", "..;x"
		}
		start = i + 1
	}
	return true
}

// normalize is Normalize's long way.
func normalize(escaped string) (string, error) {
	if escaped == "" {
		return "/", nil
	}
	if escaped[0] != '/' {
		return "", notCanonical(escaped, "does not start with /")
	}
	var b strings.Builder
	b.Grow(len(escaped))
	for i := 0; i < len(escaped); i++ {
		c := escaped[i]
		switch {
		case c == '%':
			if i+2 >= len(escaped) {
				return "", notCanonical(escaped, "a %% at byte %d is not followed by two hex digits", i)
			}
			hi, ok1 := unhex(escaped[i+1])
			lo, ok2 := unhex(escaped[i+2])
			if !ok1 || !ok2 {
				return "", notCanonical(escaped, "a %% at byte %d is not followed by two hex digits", i)
			}
			v := hi<<4 | lo
			switch {
			case unreserved(v):
				b.WriteByte(v)
			case control(v):
				return "", notCanonical(escaped, "encodes the control character %#02x", v)
			case v == '\\':
				return "", notCanonical(escaped, `encodes a backslash (%%5C), which some servers read as /`)
			default:
				b.WriteByte('%')
				b.WriteByte(upperHex[v>>4])
				b.WriteByte(upperHex[v&15])
			}
			i += 2
		case control(c):
			return "", notCanonical(escaped, "holds the control character %#02x", c)
		case c == '\\':
			return "", notCanonical(escaped, `holds a backslash, which some servers read as /`)
		case c == '?' || c == '#':
			return "", notCanonical(escaped, "holds %q: give the path without its query or fragment", c)
		case plainInPath(c):
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&15])
		}
	}
	enc := b.String()

	segs := strings.Split(enc[1:], "/")
	out := make([]string, 0, len(segs))
	trailing := false
	for _, s := range segs {
		switch s {
		case "":
			trailing = true
			continue
		case ".":
			trailing = true
			continue
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
			trailing = true
			continue
		}
		trailing = false
		out = append(out, s)
	}
	for _, s := range out {
		if err := checkSegment(escaped, s); err != nil {
			return "", err
		}
	}
	if len(out) == 0 {
		return "/", nil
	}
	p := "/" + strings.Join(out, "/")
	if trailing {
		p += "/"
	}
	return p, nil
}

// checkSegment refuses a segment of the encoded form that servers would
// read as something else than a name.
func checkSegment(in, seg string) error {
	if strings.Contains(seg, "%25") {
		for j := 0; j+4 < len(seg); j++ {
			if seg[j:j+3] == "%25" {
				if _, ok := unhex(seg[j+3]); ok {
					if _, ok := unhex(seg[j+4]); ok {
						return notCanonical(in, "holds %s, an encoded percent-encoding, which a server that decodes twice reads as another character", seg[j:j+5])
					}
				}
			}
		}
	}
	for _, part := range strings.Split(seg, "%2F") {
		if part == "" {
			return notCanonical(in, "the segment %q has an encoded slash (%%2F) at an end or next to another, an empty segment to a server that decodes it", seg)
		}
		name := part
		if i := strings.IndexByte(name, ';'); i >= 0 {
			name = name[:i]
		}
		if i := strings.Index(name, "%3B"); i >= 0 {
			name = name[:i]
		}
		if onlyDotsAndSpaces(name) {
			return notCanonical(in, "the segment %q is a dot segment or an empty one to a server that drops ;parameters or trailing dots and spaces", seg)
		}
	}
	dec := PercentDecode(seg)
	if !utf8.ValidString(dec) {
		return notCanonical(in, "the segment %q does not decode to UTF-8 (an overlong or cut sequence)", seg)
	}
	for _, r := range dec {
		if r < utf8.RuneSelf {
			continue
		}
		if unicode.Is(unicode.Cc, r) {
			return notCanonical(in, "the segment %q holds the control character %U", seg, r)
		}
		if k := norm.NFKC.String(string(r)); strings.ContainsAny(k, `./\;%?#`) {
			return notCanonical(in, "the segment %q holds %U, which reads as %q to a server that applies Unicode compatibility normalisation", seg, r, k)
		}
	}
	return nil
}

// onlyDotsAndSpaces reports whether s, decoded, is empty or made of "." and
// " " only.
func onlyDotsAndSpaces(s string) bool {
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '.':
		case strings.HasPrefix(s[i:], "%20"):
			i += 2
		default:
			return false
		}
	}
	return true
}

// PercentDecode undoes every %XX escape of s, leaving a "%" without two
// hex digits as it is ("+" is not a space here). It is lenient so that it
// can read anything: Normalize's own output, or a guest's bytes searched
// for a value (package secrets).
func PercentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if hi, ok := unhex(s[i+1]); ok {
				if lo, ok := unhex(s[i+2]); ok {
					b = append(b, hi<<4|lo)
					i += 2
					continue
				}
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// NormalizeQuery returns the canonical form of a raw query (after "?",
// without it): percent-encoded unreserved characters decoded, other escapes
// with upper-case hex, raw bytes a query may not hold plainly encoded. A
// control character, a "#" or a "%" without two hex digits is refused.
// Parameter order and "+" are left alone: a rule's query names pairs, which
// are compared as a set (see Rule).
func NormalizeQuery(raw string) (string, error) {
	plain := true
	for i := 0; i < len(raw) && plain; i++ {
		plain = plainInPath(raw[i]) || raw[i] == '?'
	}
	if plain {
		return raw, nil // nothing to decode or encode
	}
	var b strings.Builder
	b.Grow(len(raw))
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case c == '%':
			if i+2 >= len(raw) {
				return "", notCanonical(raw, "a %% at byte %d is not followed by two hex digits", i)
			}
			hi, ok1 := unhex(raw[i+1])
			lo, ok2 := unhex(raw[i+2])
			if !ok1 || !ok2 {
				return "", notCanonical(raw, "a %% at byte %d is not followed by two hex digits", i)
			}
			v := hi<<4 | lo
			if unreserved(v) {
				b.WriteByte(v)
			} else {
				b.WriteByte('%')
				b.WriteByte(upperHex[v>>4])
				b.WriteByte(upperHex[v&15])
			}
			i += 2
		case control(c):
			return "", notCanonical(raw, "holds the control character %#02x", c)
		case c == '#':
			return "", notCanonical(raw, "holds #: give the query without its fragment")
		case plainInPath(c) || c == '?':
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(upperHex[c>>4])
			b.WriteByte(upperHex[c&15])
		}
	}
	return b.String(), nil
}
