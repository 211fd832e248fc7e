package allowlist

import (
	"strings"
	"sync"

	psl "github.com/weppos/publicsuffix-go/publicsuffix"
)

// suffixesBelow maps every name that has a public suffix strictly below it
// to the shortest such suffix, from both sections of the Public Suffix List.
// *.amazonaws.com would match s3.amazonaws.com, whose children are anyone's
// buckets: a wildcard over such a name covers unrelated owners. x/net's
// publicsuffix answers "is this a suffix" but cannot list what lies below a
// name, so the rules are read from publicsuffix-go's table (built once, on
// the first wildcard entry parsed).
var suffixesBelow = sync.OnceValue(func() map[string]string {
	rules := psl.DefaultRules()
	below := make(map[string]string, 3*len(rules))
	for i := range rules {
		r := &rules[i]
		if r.Type == psl.ExceptionType {
			continue // an exception makes a name an owner's, not a suffix
		}
		v := strings.ToLower(r.Value)
		if !isASCII(v) {
			a, err := idnaProfile.ToASCII(v)
			if err != nil {
				continue
			}
			v = a
		}
		suffix := v
		if r.Type == psl.WildcardType {
			// *.kawasaki.jp: every child of kawasaki.jp is a suffix, so
			// kawasaki.jp itself has suffixes below it.
			suffix = "*." + v
			note(below, v, suffix)
		}
		for i := strings.IndexByte(v, '.'); i >= 0; i = strings.IndexByte(v, '.') {
			v = v[i+1:]
			note(below, v, suffix)
		}
	}
	return below
})

func note(below map[string]string, name, suffix string) {
	if cur, ok := below[name]; !ok || len(suffix) < len(cur) || len(suffix) == len(cur) && suffix < cur {
		below[name] = suffix
	}
}

// suffixBelow returns a public suffix lying below name (the shortest), or ""
// when there is none.
func suffixBelow(name string) string { return suffixesBelow()[name] }
