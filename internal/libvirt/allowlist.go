package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

// A domain definition abox did not build itself (a user template, or the
// one a snapshot brings back) is walked element by element against an
// allow list: every element must be one the list has at that place, with
// only the attributes the list gives it, each value passing its check, and
// text only where the list allows text. Anything else is refused, naming
// the element, its line and why. The list itself is domainAllowList
// (template_check.go); this file is the walk.

// value checks one attribute's value or one element's text. The error
// says what is wrong with v, without naming the element (the walk does).
type value func(c *checker, v string) error

// attrs are an element's allowed attributes, each with its check.
type attrs map[string]value

// kids are the elements an element may hold, by name.
type kids map[string]*elem

// elem is what the allow list says about one element at one place.
type elem struct {
	attrs attrs    // the attributes it may have
	req   []string // the attributes it must have
	text  value    // the check of its text; nil: it has none
	kids  kids     // the elements it may hold
	need  []string // the elements it must hold
	// by names the attribute that says what kind of element this is
	// (<serial type='file'>): kinds holds what each allowed kind may
	// have (the attribute itself needs no entry), and byDefault is the
	// kind libvirt takes when the attribute is absent ("": it must be
	// given). A kind not in kinds is refused.
	by        string
	byDefault string
	kinds     map[string]*elem
	// live marks what only libvirt writes (aliases of its own, labels it
	// picked, the tap it made): allowed in a definition libvirt reports,
	// never in a template.
	live bool
	// skip: the element's content is not looked at (<metadata>, which
	// abox replaces with its own).
	skip bool
}

// why gives the reason a refused element, kind or attribute is refused,
// where there is more to say than that abox does not know it. Keys are
// "parent/name" or "name" for elements, "name[kind]" for kinds and
// "name@attr" or "@attr" for attributes.
type why map[string]string

// checker is one walk: what it judges against.
type checker struct {
	p Params
	// live: the document is a definition libvirt reports (a snapshot's,
	// or the one running after a revert), not a template.
	live bool
	// reserved are the paths abox itself uses in the instance's directory.
	reserved []string
	why      why
}

// subject says what the document is, for messages.
func (c *checker) subject() string {
	if c.live {
		return "the definition the snapshot brings back"
	}
	return "a domain template"
}

// refusal is an element, attribute or value the allow list refuses.
type refusal struct {
	line int
	what string // <devices><disk><source> attribute 'file', ...
	err  error
	c    *checker
}

func (r *refusal) Error() string {
	msg := fmt.Sprintf("line %d: %s is not allowed in %s: %v", r.line, r.what, r.c.subject(), r.err)
	if !r.c.live {
		msg += " (docs/images.md lists what a template may hold)"
	}
	return msg
}

func (r *refusal) Unwrap() error { return r.err }

var errUnknown = errors.New("abox does not know it to be harmless; take it out")

// reason is the recorded reason for key, or errUnknown.
func (c *checker) reason(keys ...string) error {
	for _, k := range keys {
		if w, ok := c.why[k]; ok {
			return errors.New(w)
		}
	}
	return errUnknown
}

// nameOf renders an element name; a name in a namespace shows the
// namespace's usual prefix (qemu:commandline) where it is a known one.
func nameOf(n xml.Name) string {
	switch n.Space {
	case "":
		return n.Local
	case qemuNamespace:
		return "qemu:" + n.Local
	}
	return "{" + n.Space + "}" + n.Local
}

const qemuNamespace = "http://libvirt.org/schemas/domain/qemu/1.0"

// pathOf renders where an element is: <devices><disk><source> (the
// <domain> around everything is left out, but for the root itself).
func pathOf(path []string) string {
	if len(path) > 1 {
		path = path[1:]
	}
	var b strings.Builder
	for _, p := range path {
		b.WriteString("<" + p + ">")
	}
	return b.String()
}

// checkDocument walks doc, which must be one <domain> element, against root.
func (c *checker) checkDocument(doc string, root *elem) error {
	dec := xml.NewDecoder(strings.NewReader(doc))
	seen := false
	for {
		line, _ := dec.InputPos()
		tok, err := dec.Token()
		if err == io.EOF {
			if !seen {
				return errors.New("it holds no <domain> element")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("it is not XML: %w", err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if seen {
				return &refusal{line, "<" + nameOf(t.Name) + "> after </domain>", errors.New("a definition is one <domain> element"), c}
			}
			if t.Name.Space != "" || t.Name.Local != "domain" {
				return &refusal{line, "<" + nameOf(t.Name) + ">", errors.New("a definition is one <domain> element"), c}
			}
			seen = true
			if err := c.element(dec, t, root, []string{"domain"}); err != nil {
				return err
			}
		case xml.CharData:
			if !blank(t) {
				return &refusal{line, "text outside <domain>", errors.New("a definition is one <domain> element"), c}
			}
		case xml.ProcInst:
			if seen || t.Target != "xml" {
				return &refusal{line, "processing instruction <?" + t.Target + "?>", errUnknown, c}
			}
		case xml.Directive:
			return &refusal{line, "<!" + firstWord(string(t)) + ">", errors.New("a definition declares no document type or entities"), c}
		}
	}
}

func blank(b []byte) bool {
	return strings.TrimFunc(string(b), unicode.IsSpace) == ""
}

func firstWord(s string) string {
	if i := strings.IndexFunc(s, unicode.IsSpace); i >= 0 {
		return s[:i]
	}
	return s
}

// element walks the element start (just read) and its content against e.
func (c *checker) element(dec *xml.Decoder, start xml.StartElement, e *elem, path []string) error {
	line, _ := dec.InputPos()
	name := path[len(path)-1]
	where := pathOf(path)
	if e.live && !c.live {
		return &refusal{line, where, errors.New("only libvirt writes it (it describes a running guest)"), c}
	}
	// Attributes: each at most once (which of two would libvirt read?),
	// none in a namespace; xmlns declarations only bind prefixes.
	given := map[string]string{}
	for _, a := range start.Attr {
		if a.Name.Space == "xmlns" || a.Name.Space == "" && a.Name.Local == "xmlns" {
			continue
		}
		if a.Name.Space != "" {
			return &refusal{line, where + " attribute '" + nameOf(a.Name) + "'", errUnknown, c}
		}
		if _, dup := given[a.Name.Local]; dup {
			return &refusal{line, where + " attribute '" + a.Name.Local + "' given twice", errors.New("give each attribute once"), c}
		}
		given[a.Name.Local] = a.Value
	}
	if e.by != "" {
		kind, ok := given[e.by]
		if !ok {
			kind = e.byDefault
		}
		if kind == "" && !ok {
			return &refusal{line, where, fmt.Errorf("it needs a %s attribute", e.by), c}
		}
		k, allowed := e.kinds[kind]
		if !allowed {
			err := c.reason(name+"["+kind+"]", name+"@"+e.by)
			if err == errUnknown {
				err = fmt.Errorf("the allowed kinds are %s", strings.Join(sortedKeys(e.kinds), ", "))
			}
			return &refusal{line, fmt.Sprintf("%s %s '%s'", where, e.by, kind), err, c}
		}
		delete(given, e.by)
		if k.live && !c.live {
			return &refusal{line, fmt.Sprintf("%s %s '%s'", where, e.by, kind), errors.New("only libvirt writes it"), c}
		}
		e = k
	}
	for _, n := range sortedKeys(given) {
		v := given[n]
		check, ok := e.attrs[n]
		if !ok {
			return &refusal{line, where + " attribute '" + n + "'", c.reason(name+"@"+n, "@"+n), c}
		}
		if err := check(c, v); err != nil {
			if w := c.reason(name+"@"+n, "@"+n); w != errUnknown {
				err = fmt.Errorf("%w: %v", err, w)
			}
			return &refusal{line, fmt.Sprintf("%s attribute '%s'", where, n), err, c}
		}
	}
	for _, n := range e.req {
		if _, ok := given[n]; !ok {
			return &refusal{line, where, fmt.Errorf("it needs a %s attribute", n), c}
		}
	}
	if e.skip {
		return dec.Skip()
	}
	var text strings.Builder
	held := map[string]bool{}
	for {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("it is not XML: %w", err)
		}
		kidLine, _ := dec.InputPos()
		switch t := tok.(type) {
		case xml.StartElement:
			kid := nameOf(t.Name)
			k, ok := e.kids[kid]
			if t.Name.Space != "" {
				ok = false
			}
			if !ok {
				return &refusal{kidLine, pathOf(append(path, kid)), c.reason(name+"/"+kid, kid), c}
			}
			held[kid] = true
			if err := c.element(dec, t, k, append(path[:len(path):len(path)], kid)); err != nil {
				return err
			}
		case xml.CharData:
			text.Write(t)
		case xml.EndElement:
			for _, n := range e.need {
				if !held[n] {
					return &refusal{line, where, fmt.Errorf("it needs a <%s> element", n), c}
				}
			}
			s := text.String()
			if e.text == nil {
				if !blank([]byte(s)) {
					return &refusal{line, where + " text", errors.New("the element holds no text"), c}
				}
				return nil
			}
			if err := e.text(c, s); err != nil {
				if w := c.reason(name + "@text"); w != errUnknown {
					err = fmt.Errorf("%w: %v", err, w)
				}
				return &refusal{line, where, err, c}
			}
			return nil
		case xml.Comment:
		case xml.ProcInst:
			return &refusal{kidLine, where + " processing instruction <?" + t.Target + "?>", errUnknown, c}
		case xml.Directive:
			return &refusal{kidLine, where + " <!" + firstWord(string(t)) + ">", errUnknown, c}
		}
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Value checks that need nothing of the instance.

func anyText(*checker, string) error { return nil }

func oneOf(vs ...string) value {
	return func(_ *checker, v string) error {
		for _, w := range vs {
			if v == w {
				return nil
			}
		}
		if len(vs) == 1 {
			return fmt.Errorf("%q: want %s", v, vs[0])
		}
		return fmt.Errorf("%q: want one of %s", v, strings.Join(vs, ", "))
	}
}

var (
	yesNo = oneOf("yes", "no")
	onOff = oneOf("on", "off")
	unit  = oneOf("b", "bytes", "KB", "k", "KiB", "MB", "M", "MiB", "GB", "G", "GiB", "TB", "T", "TiB")
)

func pattern(what string, re *regexp.Regexp) value {
	return func(_ *checker, v string) error {
		if !re.MatchString(v) {
			return fmt.Errorf("%q: want %s", v, what)
		}
		return nil
	}
}

var (
	num     = pattern("a decimal number", regexp.MustCompile(`^[0-9]{1,20}$`))
	integer = pattern("a decimal number", regexp.MustCompile(`^-?[0-9]{1,20}$`))
	// hexNum: libvirt writes device addresses in hex.
	hexNum = pattern("a number", regexp.MustCompile(`^(0[xX][0-9a-fA-F]{1,16}|[0-9]{1,20})$`))
	dotted = pattern("a number or a dotted port path", regexp.MustCompile(`^[0-9]{1,5}(\.[0-9]{1,5}){0,4}$`))
	// token: a name (a CPU model or feature, a machine type, an alias).
	token  = pattern("a name of letters, digits and . _ : + -", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}$`))
	cpuset = pattern("a CPU or node set (0-3,^2)", regexp.MustCompile(`^[0-9,^-]{1,256}$`))
	uuidV  = pattern("a UUID", regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`))
	macV   = pattern("a MAC address", regexp.MustCompile(`^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$`))
	hexStr = pattern("hex digits", regexp.MustCompile(`^(0x)?[0-9a-fA-F]{1,32}$`))
)

// printable: one line of printable text (a disk's serial, a label).
func printable(_ *checker, v string) error {
	if len(v) > 256 || strings.IndexFunc(v, func(r rune) bool { return !unicode.IsPrint(r) }) >= 0 {
		return fmt.Errorf("%q: want at most 256 printable characters", v)
	}
	return nil
}

// liveOnly allows an attribute only in a definition libvirt reports.
func liveOnly(v value) value {
	return func(c *checker, s string) error {
		if !c.live {
			return errors.New("only libvirt sets it (it describes a running guest)")
		}
		return v(c, s)
	}
}
