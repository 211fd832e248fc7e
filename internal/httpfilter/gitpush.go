package httpfilter

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/gitpush"
)

// maxPushDrain bounds what is read and dropped of a refused push's pack
// before answering, so that git, still sending, reads the answer instead
// of a reset. A larger pack is cut off: the connection closes after the
// answer (git may then report a broken pipe rather than the reason).
const maxPushDrain = 64 << 20

// holdPush holds a git push to a host with push rules (docs/gitpush.md):
// a POST (any method but GET and HEAD) to git-receive-pack has its command section read before anything
// goes upstream, and is refused unless every ref update it asks for is
// allowed. It returns true when it answered r; else r goes on, its body
// replayed whole from the first byte. serveForward calls it once the host
// and the request rules allowed r.
func (p *Proxy) holdPush(w http.ResponseWriter, r *http.Request, rec *record, d decision) bool {
	set := d.list.Push(d.rule)
	// Every method but a read is held: an origin may route "post" (or any
	// other spelling) to receive-pack as it does POST.
	if set == nil || !isPush(r.Method, r.RequestURI) {
		return false
	}
	rec.ruleSet = set.Name()
	enforce := d.mode.EnforcesRules()
	if ce := r.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		// git never compresses a push (only fetch requests); a body
		// that is would have to be decoded to be judged.
		rec.detail = "Content-Encoding " + ce
		if !enforce {
			rec.wouldDeny = gitpush.ReasonEncoding
			return false
		}
		p.refuse(w, rec, http.StatusForbidden, gitpush.ReasonEncoding, true)
		return true
	}
	var body io.Reader = http.NoBody
	if r.Body != nil {
		body = r.Body
	}
	req, raw, err := gitpush.Read(body)
	var pd gitpush.Decision
	reason := gitpush.ReasonUnreadable
	switch {
	case errors.Is(err, gitpush.ErrRefused):
		reason = gitpush.ReasonUnjudgeable
	case err == nil:
		pd = set.Check(req)
		reason = pd.Reason
	}
	if err != nil {
		rec.detail = err.Error()
	} else {
		rec.detail = "push " + pd.Summary()
	}
	if err == nil && pd.Allowed || !enforce {
		if err != nil || !pd.Allowed {
			rec.wouldDeny = reason
		}
		if r.Body != nil {
			r.Body = &replayBody{ReadCloser: r.Body, prefix: raw}
		}
		return false
	}
	if !req.Answers() {
		// A client that asked for no report takes any 200 for success.
		p.refuse(w, rec, http.StatusForbidden, reason, true)
		return true
	}
	rec.verdict, rec.reason, rec.status = allowlist.Block, reason, http.StatusOK
	rec.denialID = newDenialID()
	msg := pushMessage(rec.host, set, pd, err, rec.denialID)
	h := w.Header()
	h.Set("Content-Type", gitpush.ContentType)
	h.Set("Cache-Control", "no-store")
	h.Set("X-Abox-Reason", reason)
	h.Set("X-Abox-Denial-Id", rec.denialID)
	if r.Body != nil {
		if n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, maxPushDrain)); n == maxPushDrain {
			h.Set("Connection", "close")
		}
	}
	// A refused push is answered 200, as git's own server answers a push
	// its hook declined: the report says what was refused, and git
	// prints it.
	w.WriteHeader(http.StatusOK)
	w.Write(gitpush.Refusal(req, pd, msg, func(v gitpush.Verdict) string {
		return v.Reason + ", abox denial id " + rec.denialID
	}))
	return true
}

// pushMessage is what git prints as "remote: ..." for a refused push.
func pushMessage(host string, set *gitpush.Set, pd gitpush.Decision, err error, id string) string {
	if err != nil {
		return fmt.Sprintf("abox proxy: push to %s refused: %v (denial id %s)", host, err, id)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "abox proxy: push to %s refused whole by the push rules of %s (denial id %s):\n", host, set.Name(), id)
	for _, v := range pd.Verdicts {
		if v.Reason != gitpush.ReasonWithRefused {
			fmt.Fprintf(&b, "  %s %s: %s\n", v.Command.Kind(), v.Command.Ref, v.Reason)
		}
	}
	fmt.Fprintf(&b, "allowed: push %s", set.String())
	return b.String()
}

// isPush reports whether method on a request-target is a push the proxy
// holds (gitpush.Held, which explain asks too).
func isPush(method, requestTarget string) bool {
	path, _ := SplitTarget(requestTarget)
	return gitpush.Held(method, path)
}
