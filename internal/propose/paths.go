package propose

import (
	"sort"
	"strings"

	"github.com/abox-dev/abox/internal/reqrules"
)

// cutMark ends a path the decision line cut (httpfilter's pathOnly).
const cutMark = "…"

// segments turns a recorded path into pattern segments: its canonical
// form split on "/", with "" last for a trailing slash, and "**" for
// where nothing more can be said literally (the path was cut, or a
// segment holds an encoded slash, which only "**" matches). ok is false
// when the path has no canonical form.
func segments(path string) ([]string, bool) {
	cut := strings.HasSuffix(path, cutMark)
	if cut {
		path = strings.TrimSuffix(path, cutMark)
		// The last segment is a piece of one: drop it.
		if i := strings.LastIndexByte(path, '/'); i >= 0 {
			path = path[:i+1]
		}
	}
	c, err := reqrules.Normalize(path)
	if err != nil {
		return nil, false
	}
	segs := strings.Split(c[1:], "/")
	if cut {
		if segs[len(segs)-1] == "" {
			segs = segs[:len(segs)-1]
		}
		return append(segs, "**"), true
	}
	for i, s := range segs {
		if strings.Contains(s, "%2F") {
			return append(segs[:i:i], "**"), true
		}
		if strings.Contains(s, "*") {
			// A literal "*" cannot be written in a pattern; "*" (one
			// segment) is the narrowest pattern that matches it.
			segs[i] = "*"
		}
	}
	return segs, true
}

// node is a trie of path segments for one method.
type node struct {
	// end: a path ends at this node (no trailing slash).
	end      bool
	children map[string]*node
}

func (n *node) child(s string) *node {
	if n.children == nil {
		n.children = map[string]*node{}
	}
	c := n.children[s]
	if c == nil {
		c = &node{}
		n.children[s] = c
	}
	return c
}

func (n *node) insert(segs []string) {
	cur := n
	for _, s := range segs {
		cur = cur.child(s)
		if s == "**" {
			return // "**" takes everything below
		}
	}
	cur.end = true
}

// merge adds o's paths into n.
func (n *node) merge(o *node) {
	n.end = n.end || o.end
	for s, c := range o.children {
		n.child(s).merge(c)
	}
}

// patterns lists the patterns (as segments after the leading "/") that
// allow every path below n and as few others as the options let: at
// least Siblings named children become "*", their subtrees merged; more
// than MaxPatterns patterns become "**". Each node's patterns are sorted.
func (n *node) patterns(o Options, depth int) [][]string {
	if _, ok := n.children["**"]; ok {
		return [][]string{{"**"}}
	}
	var out [][]string
	if n.end && depth > 0 {
		out = append(out, nil)
	}
	var named []string
	for s := range n.children {
		if s != "" && s != "*" {
			named = append(named, s)
		}
	}
	sort.Strings(named)
	if _, ok := n.children[""]; ok {
		out = append(out, []string{""}) // a trailing slash: "" ends a path
	}
	under := func(prefix string, c *node) {
		for _, p := range c.patterns(o, depth+1) {
			out = append(out, append([]string{prefix}, p...))
		}
	}
	star := n.children["*"]
	if len(named) >= o.Siblings {
		merged := &node{}
		if star != nil {
			merged.merge(star)
		}
		for _, s := range named {
			merged.merge(n.children[s])
		}
		star, named = merged, nil
	}
	for _, s := range named {
		under(s, n.children[s])
	}
	if star != nil {
		under("*", star)
	}
	if len(out) > o.MaxPatterns {
		return [][]string{{"**"}}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Join(out[i], "/") < strings.Join(out[j], "/") })
	return out
}
