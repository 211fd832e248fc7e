// Package api is the local control API of an instance's filters: a small JSON
// API on a unix socket (mode 0600, peer uid checked) used by the abox CLI.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/abox-dev/abox/internal/allowlist"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/policy"
)

// Component is a filter hosted by the daemon (dns, http, later monitor).
type Component interface {
	// Name is the stable component name used in the CLI ("dns", "http").
	Name() string
	// Stats returns a JSON-encodable snapshot of the component's counters.
	Stats() any
}

// KeyLogger is implemented by the HTTP filter: it switches the TLS key log.
type KeyLogger interface {
	SetKeyLog(enabled bool) error
	KeyLogPath() string
	KeyLogEnabled() bool
	// KeyLogStopped is why the key log, while on, writes no more keys.
	KeyLogStopped() string
	// SetKeyLogSecretSessions opts the key log, while on, into the keys
	// of sessions that carried an injected secret; switching the log off
	// clears it.
	SetKeyLogSecretSessions(on bool) error
	KeyLogSecretSessions() bool
	// KeyLogWithheld counts the sessions left out of the key log because
	// they carried an injected secret.
	KeyLogWithheld() uint64
}

// Server serves the API for one instance.
type Server struct {
	// Instance is the instance name reported in status.
	Instance string
	Policy   *policy.Engine
	// Components are the filters, keyed by Name().
	Components []Component
	// Logs holds each component's recent decision log lines, keyed by name.
	Logs map[string]*logring.Ring
	// KeyLog is optional.
	KeyLog KeyLogger
	Logger *slog.Logger
	// AllowedUIDs may connect besides root and the server's own uid.
	AllowedUIDs []int
	// Metrics serves GET /metrics (the Prometheus text exposition); nil
	// answers 404.
	Metrics http.Handler
}

type ctxKey struct{}

// Listen creates the unix socket at path with mode 0600, replacing a stale
// socket but refusing to steal one that a live server still answers on.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("creating api socket directory: %w", err)
	}
	if _, err := os.Stat(path); err == nil {
		if c, err := net.DialTimeout("unix", path, 500*time.Millisecond); err == nil {
			c.Close()
			return nil, fmt.Errorf("api socket %s is in use by a running filter: stop it first or use another instance name", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale api socket: %w", err)
		}
	}
	// The umask makes the socket 0600 from its creation: no window in which
	// another user could connect.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on api socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("securing api socket: %w", err)
	}
	return l, nil
}

// Serve answers API requests on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, ctxKey{}, peerUID(c))
		},
	}
	return ServeUntil(ctx, hs, l, "api")
}

// ServeUntil runs hs on l until ctx ends, then shuts it down (2 s for the
// requests in flight); what names the server in its error.
func ServeUntil(ctx context.Context, hs *http.Server, l net.Listener, what string) error {
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		hs.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("serving %s: %w", what, err)
	}
}

// peerUID returns the connecting process's uid, or -1 when unknown.
func peerUID(c net.Conn) int {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return -1
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	raw.Control(func(fd uintptr) {
		cred, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}

// uidAllowed: root, the server's own uid and AllowedUIDs; never an unknown
// peer (uid < 0), whatever the lists hold.
func (s *Server) uidAllowed(uid int) bool {
	if uid < 0 {
		return false
	}
	if uid == 0 || uid == os.Geteuid() {
		return true
	}
	for _, a := range s.AllowedUIDs {
		if a == uid {
			return true
		}
	}
	return false
}

// Handler returns the API's HTTP handler (exported for tests).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", s.status)
	mux.HandleFunc("GET /v1/mode", s.getMode)
	mux.HandleFunc("PUT /v1/mode", s.setMode)
	mux.HandleFunc("POST /v1/reload", s.reload)
	mux.HandleFunc("GET /v1/allowlist", s.listAllowlist)
	mux.HandleFunc("POST /v1/allowlist/add", s.addAllowlist)
	mux.HandleFunc("POST /v1/allowlist/remove", s.removeAllowlist)
	mux.HandleFunc("GET /v1/allowlist/text", s.getAllowlistText)
	mux.HandleFunc("PUT /v1/allowlist/text", s.putAllowlistText)
	mux.HandleFunc("GET /v1/profile", s.getProfile)
	mux.HandleFunc("DELETE /v1/profile", s.clearProfile)
	mux.HandleFunc("GET /v1/learn", s.getLearned)
	mux.HandleFunc("DELETE /v1/learn", s.clearLearned)
	mux.HandleFunc("GET /v1/logs/{component}", s.logs)
	mux.HandleFunc("GET /v1/keylog", s.getKeyLog)
	mux.HandleFunc("PUT /v1/keylog", s.setKeyLog)
	mux.HandleFunc("GET /metrics", s.metrics)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A request whose peer is unknown (credentials unreadable, or a
		// connection that did not come through Serve) is nobody's: -1.
		uid, ok := r.Context().Value(ctxKey{}).(int)
		if !ok {
			uid = -1
		}
		if !s.uidAllowed(uid) {
			if uid < 0 {
				writeErr(w, http.StatusForbidden, errors.New("the caller's credentials could not be read"), "connect through the instance's unix socket")
				return
			}
			writeErr(w, http.StatusForbidden, fmt.Errorf("uid %d may not control this instance", uid), "run abox as root or as the user that started it")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Status is the body of GET /v1/status.
type Status struct {
	Instance   string              `json:"instance"`
	Mode       policy.Mode         `json:"mode"`
	Allowlist  policy.ReloadStatus `json:"allowlist"`
	Components map[string]any      `json:"components"`
	KeyLog     *KeyLogStatus       `json:"keylog,omitempty"`
}

// KeyLogStatus is the body of GET/PUT /v1/keylog.
type KeyLogStatus struct {
	Enabled bool   `json:"enabled"`
	Path    string `json:"path"`
	// Stopped, while Enabled, is why no more keys are written (the key
	// log reached its cap, a write failed); empty otherwise.
	Stopped string `json:"stopped,omitempty"`
	// SecretSessions: the keys of sessions that carried an injected
	// secret are written too. In a PUT, true opts in (with Enabled);
	// switching the log off clears it.
	SecretSessions bool `json:"secret_sessions,omitempty"`
	// Withheld counts the sessions whose keys were left out because they
	// carried an injected secret, since the filters started.
	Withheld uint64 `json:"withheld"`
}

// ErrorBody is every error response.
type ErrorBody struct {
	Error string `json:"error"`
	Hint  string `json:"hint,omitempty"`
}

// EntriesBody carries allowlist entries both ways. In a request, each of
// Entries is an allowlist line: a name, or a name and one rule
// ("api.github.com GET,HEAD /**"). In a listing, Entries are the names and
// Lines every line, a name with rules once per rule; after a remove,
// Lines are the lines removed, a name's rules included.
type EntriesBody struct {
	Entries []string `json:"entries"`
	Lines   []string `json:"lines,omitempty"`
	// Gone, after a remove, names the entries no longer listed because
	// their last rule was removed.
	Gone []string `json:"gone,omitempty"`
	Path string   `json:"path,omitempty"`
}

// ModeBody carries the mode.
type ModeBody struct {
	Mode policy.Mode `json:"mode"`
}

// LogsBody carries recent log lines.
type LogsBody struct {
	Lines []json.RawMessage `json:"lines"`
	// Seq is the sequence number of the newest line; pass it back as
	// ?since= to follow.
	Seq uint64 `json:"seq"`
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st := Status{
		Instance:   s.Instance,
		Mode:       s.Policy.Mode(),
		Allowlist:  s.Policy.Status(),
		Components: map[string]any{},
	}
	for _, c := range s.Components {
		st.Components[c.Name()] = c.Stats()
	}
	if s.KeyLog != nil {
		k := s.keyLogStatus()
		st.KeyLog = &k
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) getMode(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, ModeBody{Mode: s.Policy.Mode()})
}

func (s *Server) setMode(w http.ResponseWriter, r *http.Request) {
	var b ModeBody
	if !readJSON(w, r, &b) {
		return
	}
	m, err := policy.ParseMode(string(b.Mode))
	if err != nil {
		writeErr(w, http.StatusBadRequest, err, "")
		return
	}
	s.Policy.SetMode(m)
	s.logger().Info("filter mode changed", "mode", string(m))
	writeJSON(w, http.StatusOK, ModeBody{Mode: m})
}

func (s *Server) reload(w http.ResponseWriter, r *http.Request) {
	if err := s.Policy.Reload(); err != nil {
		writeErr(w, http.StatusUnprocessableEntity, err, "fix the listed lines; the previous allowlist stays in force")
		return
	}
	writeJSON(w, http.StatusOK, s.Policy.Status())
}

func (s *Server) listAllowlist(w http.ResponseWriter, r *http.Request) {
	l := s.Policy.List()
	out, lines := []string{}, []string{}
	for _, e := range l.Entries() {
		out = append(out, e.String())
	}
	for _, ln := range l.Lines() {
		lines = append(lines, ln.String())
	}
	writeJSON(w, http.StatusOK, EntriesBody{Entries: out, Lines: lines, Path: s.Policy.Path()})
}

func (s *Server) addAllowlist(w http.ResponseWriter, r *http.Request) {
	var b EntriesBody
	if !readJSON(w, r, &b) {
		return
	}
	added, err := s.Policy.Add(b.Entries...)
	if err != nil {
		s.writeEditErr(w, err)
		return
	}
	if added == nil {
		added = []string{}
	}
	writeJSON(w, http.StatusOK, EntriesBody{Entries: added, Path: s.Policy.Path()})
}

func (s *Server) removeAllowlist(w http.ResponseWriter, r *http.Request) {
	var b EntriesBody
	if !readJSON(w, r, &b) {
		return
	}
	before := s.Policy.List()
	removed, err := s.Policy.Remove(b.Entries...)
	if err != nil {
		s.writeEditErr(w, err)
		return
	}
	// A name took its rules with it, and a rule line whose name has no
	// rules left took the name: say both.
	var lines, gone []string
	l := s.Policy.List()
	for _, r := range removed {
		ln, err := allowlist.ParseLine(r)
		if err != nil {
			continue
		}
		if ln.Rule == nil {
			if rs := before.Rules(r); rs != nil {
				for _, rule := range rs.Rules() {
					lines = append(lines, allowlist.Line{Entry: ln.Entry, Rule: &rule}.String())
				}
				continue
			}
		} else if !l.Contains(ln.Entry) && !slices.Contains(gone, ln.Entry.String()) {
			gone = append(gone, ln.Entry.String())
		}
		lines = append(lines, r)
	}
	writeJSON(w, http.StatusOK, EntriesBody{Entries: removed, Lines: lines, Gone: gone, Path: s.Policy.Path()})
}

// TextBody carries the allowlist's text: in force (GET), or to put in force
// if the text in force is still Expected (PUT).
type TextBody struct {
	Text     string `json:"text"`
	Expected string `json:"expected,omitempty"`
	Path     string `json:"path,omitempty"`
}

func (s *Server) getAllowlistText(w http.ResponseWriter, r *http.Request) {
	b, err := s.Policy.Text()
	if err != nil {
		writeErr(w, http.StatusInternalServerError, err, "")
		return
	}
	writeJSON(w, http.StatusOK, TextBody{Text: string(b), Path: s.Policy.Path()})
}

func (s *Server) putAllowlistText(w http.ResponseWriter, r *http.Request) {
	var b TextBody
	if !readJSON(w, r, &b) {
		return
	}
	if err := s.Policy.Replace([]byte(b.Expected), []byte(b.Text)); err != nil {
		s.writeEditErr(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.Policy.Status())
}

// writeEditErr answers a failed allowlist edit: 409 when the list changed
// meanwhile, 507 when the change is in force but could not be saved, 422
// for invalid entries.
func (s *Server) writeEditErr(w http.ResponseWriter, err error) {
	var ue *policy.UnsavedError
	var ce *policy.RulesConflictError
	switch {
	case errors.As(err, &ce) && ce.Listed:
		name := s.Instance
		if name == "" {
			name = "NAME" // a standalone filter's API
		}
		if ce.Rules != "" {
			writeErr(w, http.StatusUnprocessableEntity, err, fmt.Sprintf("abox allowlist remove %s %s, then abox allowlist add %s %s", name, ce.Entry, name, ce.Line))
		} else {
			writeErr(w, http.StatusUnprocessableEntity, err, fmt.Sprintf("abox allowlist remove %s %s, then abox allowlist add %s '%s' (and its other rules)", name, ce.Entry, name, ce.Line))
		}
	case errors.Is(err, policy.ErrChanged):
		writeErr(w, http.StatusConflict, err, "run the edit again")
	case errors.As(err, &ue):
		writeErr(w, http.StatusInsufficientStorage, err, "")
	default:
		writeErr(w, http.StatusUnprocessableEntity, err, "")
	}
}

func (s *Server) getProfile(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Policy.Profile())
}

func (s *Server) clearProfile(w http.ResponseWriter, r *http.Request) {
	s.Policy.ClearProfile()
	writeJSON(w, http.StatusOK, s.Policy.Profile())
}

func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("component")
	ring, ok := s.Logs[name]
	if !ok {
		writeErr(w, http.StatusNotFound, fmt.Errorf("no component %q in this instance", name), "")
		return
	}
	var lines [][]byte
	var seq uint64
	if v := r.URL.Query().Get("since"); v != "" {
		since, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("bad since %q", v), "")
			return
		}
		lines, seq = ring.Since(since)
	} else {
		n := 100
		if v := r.URL.Query().Get("n"); v != "" {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 0 {
				writeErr(w, http.StatusBadRequest, fmt.Errorf("bad n %q", v), "")
				return
			}
		}
		lines, seq = ring.Last(n)
	}
	body := LogsBody{Lines: make([]json.RawMessage, 0, len(lines)), Seq: seq}
	for _, l := range lines {
		if json.Valid(l) {
			body.Lines = append(body.Lines, l)
		}
	}
	writeJSON(w, http.StatusOK, body)
}

func (s *Server) getKeyLog(w http.ResponseWriter, r *http.Request) {
	if s.KeyLog == nil {
		writeErr(w, http.StatusNotFound, errors.New("this instance has no HTTP filter"), "")
		return
	}
	writeJSON(w, http.StatusOK, s.keyLogStatus())
}

func (s *Server) keyLogStatus() KeyLogStatus {
	return KeyLogStatus{Enabled: s.KeyLog.KeyLogEnabled(), Path: s.KeyLog.KeyLogPath(), Stopped: s.KeyLog.KeyLogStopped(),
		SecretSessions: s.KeyLog.KeyLogSecretSessions(), Withheld: s.KeyLog.KeyLogWithheld()}
}

func (s *Server) setKeyLog(w http.ResponseWriter, r *http.Request) {
	if s.KeyLog == nil {
		writeErr(w, http.StatusNotFound, errors.New("this instance has no HTTP filter"), "")
		return
	}
	var b KeyLogStatus
	if !readJSON(w, r, &b) {
		return
	}
	if err := s.KeyLog.SetKeyLog(b.Enabled); err != nil {
		writeErr(w, http.StatusInternalServerError, err, "")
		return
	}
	if b.Enabled && b.SecretSessions {
		if err := s.KeyLog.SetKeyLogSecretSessions(true); err != nil {
			writeErr(w, http.StatusInternalServerError, err, "")
			return
		}
	}
	writeJSON(w, http.StatusOK, s.keyLogStatus())
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if s.Metrics == nil {
		writeErr(w, http.StatusNotFound, errors.New("this instance's filters serve no metrics"), "restart the instance with a version of abox that does")
		return
	}
	s.Metrics.ServeHTTP(w, r)
}

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}

const maxBody = 1 << 20

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, fmt.Errorf("decoding request: %w", err), "")
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error, hint string) {
	writeJSON(w, code, ErrorBody{Error: err.Error(), Hint: hint})
}
