package gitpush

import (
	"fmt"
	"strings"
)

// ContentType is the type of receive-pack's answer to a push.
const ContentType = "application/x-git-receive-pack-result"

// Answers reports whether a refusal of req can be told to the client in
// git's own terms: only a client that asked for report-status reads a
// per-ref result (git always asks). Without one, a 200 would read as
// success, so the caller answers with an HTTP error instead.
func (r *Request) Answers() bool {
	return r != nil && (r.Has("report-status") || r.Has("report-status-v2"))
}

// Refusal is the body of a 200 answer to a refused push, as git's
// receive-pack answers a push its pre-receive hook declined: the report
// "unpack ok", then "ng REF REASON" for every command (a push is refused
// whole), and, when the client multiplexes (side-band-64k), message on
// the progress band first, which git prints as "remote: ...". why gives
// each command's reason text. With no commands (a request refused before
// they were read) the report is message alone on the error band, or an
// ERR line, which git prints as "remote error: ..." and stops.
func Refusal(req *Request, d Decision, message string, why func(Verdict) string) []byte {
	var report []byte
	if len(d.Verdicts) > 0 {
		report = pkt(report, "unpack ok\n")
		for _, v := range d.Verdicts {
			report = pkt(report, fmt.Sprintf("ng %s %s\n", v.Command.Ref, oneLine(why(v))))
		}
		report = append(report, "0000"...)
	}
	max := 0
	switch {
	case req.Has("side-band-64k"):
		max = MaxPktLen - 5
	case req.Has("side-band"):
		max = 1000 - 5
	}
	if max == 0 {
		if report == nil {
			return pkt(nil, "ERR "+oneLine(message)+"\n")
		}
		return report
	}
	var out []byte
	band := func(b byte, p []byte) {
		for len(p) > 0 {
			n := min(len(p), max)
			out = fmt.Appendf(out, "%04x", n+5)
			out = append(out, b)
			out = append(out, p[:n]...)
			p = p[n:]
		}
	}
	if report == nil {
		band(3, []byte(oneLine(message)+"\n"))
	} else {
		for _, l := range strings.Split(strings.TrimRight(message, "\n"), "\n") {
			band(2, []byte(l+"\n"))
		}
		band(1, report)
	}
	return append(out, "0000"...)
}

func pkt(b []byte, s string) []byte {
	b = fmt.Appendf(b, "%04x", len(s)+4)
	return append(b, s...)
}

// oneLine keeps a reason to one printable line of bounded length.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 900 {
		s = s[:900]
	}
	return s
}
