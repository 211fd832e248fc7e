package identity

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/abox-dev/abox/internal/ca"
	"github.com/abox-dev/abox/internal/steps"
)

var t0 = time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)

// testIdentity is a complete identity of instance name.
func testIdentity(t *testing.T, name string) Identity {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sp, _ := ssh.NewPublicKey(pub)
	authority, err := ca.New(ca.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := authority.CertPEM()
	if err != nil {
		t.Fatal(err)
	}
	return Identity{
		Hostname: name, User: "agent",
		AuthorizedKey: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))),
		HostKeyPEM:    pem.EncodeToMemory(blk), CACertPEM: caPEM,
		Network: Network{MAC: "52:54:00:12:34:56", Address: netip.MustParsePrefix("10.10.2.10/24"), Gateway: netip.MustParseAddr("10.10.2.1")},
	}
}

// honest is an agent that does what it is asked and reports it.
func honest(req Request) Reply {
	key, _ := HostKeyFingerprint([]byte(req.HostKeyPEM))
	caSum, _ := CAFingerprint([]byte(req.CACertPEM))
	return Reply{HostKeySHA256: key, MachineID: req.MachineID, Hostname: req.Hostname, Time: req.Time,
		CASHA256: []string{caSum}, Network: req.Network}
}

// guest answers one request on its end of a pipe with apply.
func guest(t *testing.T, apply func(Request) Reply) (host net.Conn, done chan error) {
	host, g := net.Pipe()
	done = make(chan error, 1)
	go func() {
		defer g.Close()
		done <- Answer(g, apply)
	}()
	t.Cleanup(func() { host.Close() })
	return host, done
}

func TestRenewWithAnHonestGuest(t *testing.T) {
	req, err := NewRequest(rand.Reader, testIdentity(t, "dev"), t0)
	if err != nil {
		t.Fatal(err)
	}
	host, done := guest(t, honest)
	var phases []string
	r := Renewer{Now: func() time.Time { return t0.Add(time.Second) }, Progress: func(ev steps.Event) {
		if ev.Phase == steps.Done {
			phases = append(phases, ev.Step)
		}
	}}
	rep, timings, err := r.Renew(context.Background(), host, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("guest side: %v", err)
	}
	if rep.MachineID != req.MachineID || len(timings) != 3 || strings.Join(phases, ",") != "send the identity,read the reply,check the reply" {
		t.Errorf("reply %+v, timings %v, phases %v", rep, timings, phases)
	}
}

// Two restores of one image get requests that share nothing random: the
// nonce, machine-id and entropy differ, and so do keys and CA of two
// instances.
func TestRequestsShareNothing(t *testing.T) {
	a, err := NewRequest(rand.Reader, testIdentity(t, "one"), t0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRequest(rand.Reader, testIdentity(t, "two"), t0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ item, x, y string }{
		{"nonce", a.Nonce, b.Nonce}, {"machine-id", a.MachineID, b.MachineID}, {"entropy", string(a.Entropy), string(b.Entropy)},
		{"host key", a.HostKeyPEM, b.HostKeyPEM}, {"CA", a.CACertPEM, b.CACertPEM}, {"authorized key", a.AuthorizedKey, b.AuthorizedKey},
	} {
		if c.x == c.y {
			t.Errorf("two requests share their %s", c.item)
		}
	}
	if a.Nonce == a.MachineID {
		t.Error("the nonce and machine-id come from the same bytes")
	}
}

func TestNewRequestRefusesBadIdentities(t *testing.T) {
	good := testIdentity(t, "dev")
	tests := []struct {
		name, want string
		edit       func(*Identity)
	}{
		{"hostname", "hostname", func(i *Identity) { i.Hostname = "a b" }},
		{"hostname with an underscore", "hostname", func(i *Identity) { i.Hostname = "my_box" }},
		{"hostname ending in -", "hostname", func(i *Identity) { i.Hostname = "box-" }},
		{"root user", "user", func(i *Identity) { i.User = "root" }},
		{"authorized key", "authorized key", func(i *Identity) { i.AuthorizedKey = "ssh-ed25519 nope" }},
		{"host key", "host key", func(i *Identity) { i.HostKeyPEM = []byte("-----BEGIN NOTHING-----") }},
		{"CA", "CA certificate", func(i *Identity) { i.CACertPEM = nil }},
		{"multicast MAC", "MAC", func(i *Identity) { i.Network.MAC = "01:00:5e:00:00:01" }},
		{"gateway outside", "network", func(i *Identity) { i.Network.Gateway = netip.MustParseAddr("10.10.3.1") }},
		{"gateway is the guest", "network", func(i *Identity) { i.Network.Gateway = i.Network.Address.Addr() }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := good
			tt.edit(&id)
			if _, err := NewRequest(rand.Reader, id, t0); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("NewRequest = %v, want a refusal naming %s", err, tt.want)
			}
		})
	}
	if _, err := NewRequest(bytes.NewReader(make([]byte, 10)), good, t0); err == nil {
		t.Error("NewRequest with too little randomness succeeded")
	}
	if _, err := NewRequest(bytes.NewReader(make([]byte, 200)), good, t0); err == nil || !strings.Contains(err.Error(), "machine-id") {
		t.Errorf("NewRequest with an all-zero machine-id = %v, want a refusal", err)
	}
}

// A guest that reports anything other than what it was sent fails the
// renewal, naming the item.
func TestRenewRefusesEveryMismatch(t *testing.T) {
	id := testIdentity(t, "dev")
	other := testIdentity(t, "other")
	otherKey, _ := HostKeyFingerprint(other.HostKeyPEM)
	otherCA, _ := CAFingerprint(other.CACertPEM)
	tests := []struct {
		item string
		lie  func(*Reply)
	}{
		{"host key", func(r *Reply) { r.HostKeySHA256 = otherKey }},
		{"machine-id", func(r *Reply) { r.MachineID = strings.Repeat("ab", 16) }},
		{"hostname", func(r *Reply) { r.Hostname = "other" }},
		{"MAC", func(r *Reply) { r.Network.MAC = other.Network.MAC + "0" }},
		{"address", func(r *Reply) { r.Network.Address = netip.MustParsePrefix("10.10.9.10/24") }},
		{"gateway", func(r *Reply) { r.Network.Gateway = netip.MustParseAddr("10.10.2.2") }},
		{"CA set", func(r *Reply) { r.CASHA256 = append(r.CASHA256, otherCA) }},
		{"CA set", func(r *Reply) { r.CASHA256 = []string{otherCA} }},
		{"clock", func(r *Reply) { r.Time = t0.Add(-time.Hour) }},
		{"clock", func(r *Reply) { r.Time = t0.Add(time.Hour) }},
	}
	for _, tt := range tests {
		t.Run(tt.item, func(t *testing.T) {
			req, err := NewRequest(rand.Reader, id, t0)
			if err != nil {
				t.Fatal(err)
			}
			host, _ := guest(t, func(req Request) Reply { r := honest(req); tt.lie(&r); return r })
			_, _, err = Renewer{Now: func() time.Time { return t0.Add(time.Second) }}.Renew(context.Background(), host, req)
			var me *MismatchError
			var se *steps.Error
			if !errors.As(err, &me) || me.Item != tt.item || !errors.As(err, &se) || se.Step != "check the reply" {
				t.Errorf("Renew = %v, want a mismatch of the %s", err, tt.item)
			}
		})
	}
}

// A reply to another request (a stale or replayed one) is refused.
func TestRenewRefusesAnotherNonce(t *testing.T) {
	req, _ := NewRequest(rand.Reader, testIdentity(t, "dev"), t0)
	host, g := net.Pipe()
	defer host.Close()
	go func() {
		var got Request
		ReadFrame(g, &got)
		rep := honest(got)
		rep.Version, rep.Nonce = Version, strings.Repeat("0", 32)
		WriteFrame(g, rep)
	}()
	_, _, err := Renewer{Now: func() time.Time { return t0 }}.Renew(context.Background(), host, req)
	var me *MismatchError
	if !errors.As(err, &me) || me.Item != "nonce" {
		t.Errorf("Renew = %v, want a nonce mismatch", err)
	}
}

// The guest's error is reported with its step; its text cannot steer
// the terminal.
func TestRenewReportsTheGuestsError(t *testing.T) {
	req, _ := NewRequest(rand.Reader, testIdentity(t, "dev"), t0)
	host, _ := guest(t, func(Request) Reply {
		return Reply{Error: &GuestError{Step: "machine-id", Reason: "read-only file system\x1b[2J"}}
	})
	_, _, err := Renewer{}.Renew(context.Background(), host, req)
	var re *RefusedError
	if !errors.As(err, &re) || re.Step != "machine-id" {
		t.Fatalf("Renew = %v, want the guest's refusal", err)
	}
	if strings.ContainsRune(err.Error(), 0x1b) {
		t.Errorf("error %q carries the guest's escape sequence", err)
	}
}

// The agent refuses an invalid request without applying anything.
func TestAnswerRefusesAnInvalidRequest(t *testing.T) {
	req, _ := NewRequest(rand.Reader, testIdentity(t, "dev"), t0)
	req.Entropy = req.Entropy[:8]
	applied := false
	host, done := guest(t, func(r Request) Reply { applied = true; return honest(r) })
	go WriteFrame(host, req)
	var rep Reply
	if err := ReadFrame(host, &rep); err != nil {
		t.Fatal(err)
	}
	<-done
	if applied || rep.Error == nil || rep.Error.Step != "request" || !strings.Contains(rep.Error.Reason, "entropy") {
		t.Errorf("applied %v, reply %+v: want a refusal of the entropy, nothing applied", applied, rep)
	}
}

func TestReadFrameRefusesHostileFrames(t *testing.T) {
	frame := func(n uint32, body string) []byte {
		b := binary.BigEndian.AppendUint32(nil, n)
		return append(b, body...)
	}
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"too long", frame(MaxFrame+1, ""), "at most"},
		{"truncated", frame(100, `{"v":1}`), "reading a frame of 100 bytes"},
		{"unknown field", frame(16, `{"v":1,"evil":1}`), "unknown field"},
		{"two objects", frame(14, `{"v":1}{"v":1}`), "after its object"},
		{"no length", []byte{0, 1}, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rep Reply
			if err := ReadFrame(bytes.NewReader(tt.in), &rep); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("ReadFrame = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// A guest that never answers cannot hold the start: ending the context
// ends the exchange with the context's error.
func TestRenewEndsWithItsContext(t *testing.T) {
	req, _ := NewRequest(rand.Reader, testIdentity(t, "dev"), t0)
	host, g := net.Pipe()
	defer host.Close()
	defer g.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		var got Request
		ReadFrame(g, &got) // read it, never answer
		cancel()
	}()
	_, _, err := Renewer{}.Renew(ctx, host, req)
	var se *steps.Error
	if !errors.Is(err, context.Canceled) || !errors.As(err, &se) || se.Step != "read the reply" {
		t.Errorf("Renew = %v, want it cancelled while reading the reply", err)
	}
}
