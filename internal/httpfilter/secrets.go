package httpfilter

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/abox-dev/abox/internal/egress"
	"github.com/abox-dev/abox/internal/httpfilter/h1"
	"github.com/abox-dev/abox/internal/reqrules"
	"github.com/abox-dev/abox/internal/secrets"
)

// SecretSource is what the proxy needs of its instance's secrets;
// secrets.Source implements it (docs/secrets.md).
type SecretSource interface {
	// Policy is the instance's current bindings and placeholders. With an
	// error the policy returned is still the one to use.
	Policy() (*secrets.Policy, error)
	// Value reads a secret's value at this moment (a rotation reaches the
	// next request).
	Value(ctx context.Context, name string) ([]byte, error)
	// Used records that a request carried the secrets names.
	Used(names []string, now time.Time) error
}

// MaxSecretBodyScan is how much of a request body, at most, the proxy reads
// ahead (and replays upstream) for the secrets decision to look for a
// placeholder in: only bodies with a Content-Length, and only on instances
// with a bound secret. A placeholder past it, or in a body without a
// length (chunked HTTP/1.1, an HTTP/2 stream without content-length), is
// not seen: reading those ahead would mean buffering uploads of any size
// or stalling a stream that waits for its answer.
const MaxSecretBodyScan = 64 << 10

// errKeysLogged is the refusal of an injection on a session whose TLS keys
// are already in the key log (the binding came after its handshake).
var errKeysLogged = errors.New("injecting a secret: this TLS session's keys are already in the key log (a binding added while it was open); the next connection injects")

// applySecrets is the secrets step of a request that passed every other
// check: it decides r as it will be sent (method, the target the rules
// decided, the header after the proxy's own removals, a bounded prefix of
// the body) and sets the bound headers from the values. It reports false
// when it refused r, with the secrets reason and a denial id.
func (p *Proxy) applySecrets(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *record, t egress.Target, scheme string, d *decision) bool {
	if p.cfg.Secrets == nil {
		return true
	}
	pol, err := p.cfg.Secrets.Policy()
	if err != nil {
		p.secretsError(err)
	}
	if pol.Empty() {
		return true
	}
	// A binding's rules decide on the canonical path and query; when the
	// host has no rules of its own, the request that gets a value is sent
	// in that form too (below), so that no spelling of another path
	// (dot segments, empty ones, encoded dots) reads as the bound one to
	// the binding and as another to the origin.
	target := d.target
	if d.rules == nil {
		path, query := SplitTarget(r.RequestURI)
		target = reqrules.NewTarget(path, query, true)
	}
	sent := r.Header.Clone()
	keepTE := httpguts.HeaderValuesContainsToken(sent["Te"], "trailers")
	h1.RemoveHopByHop(sent)
	if keepTE {
		sent["Te"] = []string{"trailers"}
	}
	removeRoutingFields(sent)
	sd := pol.Decide(&secrets.Request{
		Host:   t.Host(),
		Port:   t.Port,
		Method: r.Method,
		Target: target,
		// Only inner requests of an intercepted TLS session are https
		// here: the proxy refuses absolute https:// requests.
		TLS:    scheme == "https",
		Header: sent,
		Body:   peekBody(r),
	})
	if sd.Refused {
		rec.secret = sd.Denial()
		p.refuse(w, rec, http.StatusForbidden, sd.Reason, false)
		return false
	}
	scanRest(r, rec, pol)
	if len(sd.Inject) == 0 {
		return true
	}
	if d.rules == nil {
		d.target, d.canonical = target, true
	}
	names := strings.Join(sd.Secrets(), ",")
	if sc, _ := ctx.Value(scopeKey{}).(*scope); sc != nil && sc.keys != nil && !sc.keys.inject() {
		rec.secret, rec.err = secrets.ReasonSecretUnavailable+": secret "+names, errKeysLogged
		p.refuse(w, rec, http.StatusForbidden, secrets.ReasonSecretUnavailable, false)
		return false
	}
	if err := secrets.Apply(r.Header, sd, func(n string) ([]byte, error) { return p.cfg.Secrets.Value(ctx, n) }); err != nil {
		rec.secret, rec.err = secrets.ReasonSecretUnavailable+": secret "+names, err
		p.refuse(w, rec, http.StatusForbidden, secrets.ReasonSecretUnavailable, false)
		return false
	}
	rec.injected = names
	if err := p.cfg.Secrets.Used(sd.Secrets(), time.Now()); err != nil {
		p.log.Warn("recording a secret's last use", "secret", names, "err", err)
	}
	return true
}

// secretsError reports a store that cannot be read or a binding that no
// longer validates, once per distinct error (the policy then injects
// less, never more).
func (p *Proxy) secretsError(err error) {
	msg := err.Error()
	if old, _ := p.secretsErr.Swap(msg).(string); old == msg {
		return
	}
	p.log.Warn("reading the secrets policy: secrets it cannot read are not injected", "err", msg)
}

// sessionBinds reports whether a secret may be injected on an intercepted
// session to t, so that its key lines are held until it ends.
func (p *Proxy) sessionBinds(t egress.Target) bool {
	if p.cfg.Secrets == nil {
		return false
	}
	pol, err := p.cfg.Secrets.Policy()
	if err != nil {
		p.secretsError(err)
	}
	return pol.Binds(t.Host(), t.Port)
}

// peekBody reads up to MaxSecretBodyScan bytes of a body with a
// Content-Length and puts them back in front of the rest. A read error
// (the guest cut the body) is replayed after the prefix, so the exchange
// sees it where it would have.
func peekBody(r *http.Request) []byte {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength <= 0 {
		return nil
	}
	buf := make([]byte, min(r.ContentLength, MaxSecretBodyScan))
	n, err := io.ReadFull(r.Body, buf)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // shorter than its Content-Length
	}
	r.Body = &replayBody{ReadCloser: r.Body, prefix: buf[:n], err: err}
	return buf[:n]
}

// errPlaceholderInBody stops a body in which bodyScan found a placeholder.
var errPlaceholderInBody = errors.New("a placeholder in the request body")

// scanRest makes the part of r's body that Decide did not see (all of a
// body without a Content-Length, what lies past MaxSecretBodyScan) pass
// through a bodyScan, so that a placeholder in it never reaches the
// origin: the body stops before the bytes holding it, and the request is
// refused as a leak (failUpstream) if nothing was answered yet.
func scanRest(r *http.Request, rec *record, pol *secrets.Policy) {
	if r.Body == nil || r.Body == http.NoBody || (r.ContentLength >= 0 && r.ContentLength <= MaxSecretBodyScan && len(r.Trailer) == 0) {
		return
	}
	r.Body = &bodyScan{ReadCloser: r.Body, pol: pol, rec: rec, trailer: r.Trailer}
}

// bodyScan passes a body on, holding back its last PlaceholderSpan-1
// bytes until more follows or it ends, and stops at the first placeholder
// of the instance: no byte from the placeholder's start on is passed on.
type bodyScan struct {
	io.ReadCloser
	pol  *secrets.Policy
	rec  *record
	buf  []byte // read, not passed on yet
	err  error  // the body's own end or error, once buf is drained
	from []byte // scratch for reads
	// trailer is the request's: the server fills its values at the
	// body's end, before the proxy forwards them (trailerBody).
	trailer http.Header
}

func (b *bodyScan) Read(p []byte) (int, error) {
	for {
		if b.rec.bodyLeak.Load() != nil {
			return 0, errPlaceholderInBody
		}
		hold := secrets.PlaceholderSpan - 1
		if b.err != nil {
			hold = 0
		}
		if n := len(b.buf) - hold; n > 0 {
			n = copy(p, b.buf[:n])
			b.buf = b.buf[n:]
			return n, nil
		}
		if b.err != nil {
			return 0, b.err
		}
		if b.from == nil {
			b.from = make([]byte, 32<<10)
		}
		m, err := b.ReadCloser.Read(b.from)
		if m > 0 {
			b.buf = append(b.buf, b.from[:m]...)
			if name := b.pol.SecretIn(b.buf); name != "" {
				d := secrets.ReasonSecretLeak + ": secret " + name + " in the " + secrets.WhereBody + " (" + secrets.DetailPlacement + ")"
				b.rec.bodyLeak.Store(&d)
				return 0, errPlaceholderInBody
			}
		}
		if err == io.EOF && b.trailerLeak() {
			return 0, errPlaceholderInBody
		}
		if err != nil {
			b.err = err
		}
	}
}

// trailerLeak reports, at the body's end, whether a trailer field names or
// holds a placeholder, and records the leak.
func (b *bodyScan) trailerLeak() bool {
	for k, vv := range b.trailer {
		name := b.pol.SecretIn([]byte(k))
		for _, v := range vv {
			if name == "" {
				name = b.pol.SecretIn([]byte(v))
			}
		}
		if name != "" {
			d := secrets.ReasonSecretLeak + ": secret " + name + " in the " + secrets.WhereTrailer + " (" + secrets.DetailPlacement + ")"
			b.rec.bodyLeak.Store(&d)
			return true
		}
	}
	return false
}

// redactRecord takes the instance's placeholders out of every field of a
// record the guest chose (path, method, host, asked, connect, sni) before
// its line is written or its answer names them, whichever step decided
// the request (a rules refusal comes before the secrets step). Only a
// field that holds the placeholders' prefix, or a percent escape that may
// spell it, costs the policy's lookup.
func (p *Proxy) redactRecord(r *record) {
	if p.cfg.Secrets == nil {
		return
	}
	var pol *secrets.Policy
	for _, f := range [...]*string{&r.path, &r.method, &r.host, &r.asked, &r.connect, &r.sni} {
		if !hasPlaceholderPrefix(*f) && strings.IndexByte(*f, '%') < 0 {
			continue
		}
		if pol == nil {
			var err error
			if pol, err = p.cfg.Secrets.Policy(); err != nil {
				p.secretsError(err)
			}
		}
		*f = pol.Redact(*f)
	}
}

// hasPlaceholderPrefix reports whether s holds secrets.PlaceholderPrefix in
// any case, without allocating.
func hasPlaceholderPrefix(s string) bool {
	const pre = secrets.PlaceholderPrefix
	for i := 0; i+len(pre) <= len(s); i++ {
		if s[i]|0x20 == pre[0] && strings.EqualFold(s[i:i+len(pre)], pre) {
			return true
		}
	}
	return false
}
