package identity

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/abox-dev/abox/internal/steps"
	"github.com/abox-dev/abox/internal/termtext"
)

// MaxFrame bounds a frame's body: a request is a few KiB (two keys and a
// certificate), a reply less.
const MaxFrame = 64 << 10

// ClockSkew is how far the time the guest reports having set may lie
// outside [the request's time, the host's time when the reply arrived].
const ClockSkew = 2 * time.Second

// WriteFrame writes v as one frame: a 4-byte big-endian length, then v's JSON.
func WriteFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("frame of %d bytes, at most %d", len(body), MaxFrame)
	}
	buf := make([]byte, 4, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	_, err = w.Write(append(buf, body...))
	return err
}

// ReadFrame reads one frame into v: at most MaxFrame bytes (a longer one
// is refused by its length, unread), one JSON object with no unknown
// field and nothing after it.
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("reading a frame's length: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return fmt.Errorf("a frame of %d bytes, at most %d", n, MaxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("reading a frame of %d bytes: %w", n, err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decoding a frame: %w", err)
	}
	if dec.More() {
		return errors.New("decoding a frame: data after its object")
	}
	return nil
}

// RefusedError: the guest's agent reported that a step of the renewal
// failed. Its text is the guest's, escaped.
type RefusedError struct{ Step, Reason string }

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the guest could not renew its identity: %s: %s", termtext.Clean(e.Step), termtext.Clean(e.Reason))
}

// MismatchError: the guest reports an item other than the one it was sent.
type MismatchError struct{ Item, Want, Got string }

func (e *MismatchError) Error() string {
	return fmt.Sprintf("the guest reports %s %q, want %q", e.Item, termtext.Clean(e.Got), e.Want)
}

// Check holds a reply to its request, item by item. received is the
// host's time when the reply arrived.
func Check(req Request, rep Reply, received time.Time) error {
	if rep.Version != Version {
		return &MismatchError{Item: "protocol version", Want: fmt.Sprint(Version), Got: fmt.Sprint(rep.Version)}
	}
	if rep.Nonce != req.Nonce {
		return &MismatchError{Item: "nonce", Want: req.Nonce, Got: rep.Nonce}
	}
	if rep.Error != nil {
		return &RefusedError{Step: rep.Error.Step, Reason: rep.Error.Reason}
	}
	key, err := HostKeyFingerprint([]byte(req.HostKeyPEM))
	if err != nil {
		return err
	}
	ca, err := CAFingerprint([]byte(req.CACertPEM))
	if err != nil {
		return err
	}
	for _, c := range []struct{ item, want, got string }{
		{"host key", key, rep.HostKeySHA256},
		{"machine-id", req.MachineID, rep.MachineID},
		{"hostname", req.Hostname, rep.Hostname},
		{"MAC", req.Network.MAC, rep.Network.MAC},
		{"address", req.Network.Address.String(), rep.Network.Address.String()},
		{"gateway", req.Network.Gateway.String(), rep.Network.Gateway.String()},
	} {
		if c.got != c.want {
			return &MismatchError{Item: c.item, Want: c.want, Got: c.got}
		}
	}
	// The new CA alone: an old instance's, left in the store, would let
	// that instance's proxy read this one's TLS.
	if !slices.Equal(rep.CASHA256, []string{ca}) {
		return &MismatchError{Item: "CA set", Want: "[" + ca + "]", Got: fmt.Sprint(rep.CASHA256)}
	}
	if rep.Time.Before(req.Time.Add(-ClockSkew)) || rep.Time.After(received.Add(ClockSkew)) {
		return &MismatchError{Item: "clock", Want: fmt.Sprintf("between %s and %s", req.Time.Format(time.RFC3339), received.Format(time.RFC3339)), Got: rep.Time.Format(time.RFC3339)}
	}
	return nil
}

// Renewer runs the host side of a renewal.
type Renewer struct {
	// Now is the host's clock; nil is time.Now.
	Now func() time.Time
	// Progress receives the exchange's steps (send, reply, check); optional.
	Progress func(steps.Event)
}

// Renew sends req over conn (the host end of the guest's Channel) and
// holds the guest's reply to it. ctx bounds the whole exchange: when it
// ends, conn's deadline is set so a guest that never answers cannot hold
// the start. The steps' durations are returned for the start's phases.
func (r Renewer) Renew(ctx context.Context, conn net.Conn, req Request) (Reply, []steps.Timing, error) {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	if err := req.Validate(); err != nil {
		return Reply{}, nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var (
		rep      Reply
		received time.Time
	)
	// A failure with ctx done is ctx's: the deadline above caused it.
	cause := func(err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return err
	}
	timings, err := steps.Runner{Prefix: "renewing the identity of " + req.Hostname, Progress: r.Progress, Now: now}.Run(ctx, []steps.Step{
		{Name: "send the identity", Do: func(context.Context) error {
			if err := WriteFrame(conn, req); err != nil {
				return cause(fmt.Errorf("sending the request: %w", err))
			}
			return nil
		}},
		{Name: "read the reply", Do: func(context.Context) error {
			if err := ReadFrame(conn, &rep); err != nil {
				return cause(fmt.Errorf("the guest's reply: %w", err))
			}
			received = now()
			return nil
		}},
		{Name: "check the reply", Do: func(context.Context) error { return Check(req, rep, received) }},
	})
	return rep, timings, err
}

// Answer is the guest agent's side of one exchange: it reads a request,
// validates it, lets apply renew the guest and writes apply's reply with
// the request's nonce. An invalid request is answered with an error reply
// (naming step "request") and apply is not called.
func Answer(rw io.ReadWriter, apply func(Request) Reply) error {
	var req Request
	if err := ReadFrame(rw, &req); err != nil {
		return err
	}
	var rep Reply
	if err := req.Validate(); err != nil {
		rep = Reply{Error: &GuestError{Step: "request", Reason: err.Error()}}
	} else {
		rep = apply(req)
	}
	rep.Version, rep.Nonce = Version, req.Nonce
	return WriteFrame(rw, rep)
}
