package monitor

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/abox-dev/abox/internal/fsutil"
)

// Defaults of Config.
const (
	DefaultMaxLine     = 64 << 10
	DefaultRate        = 500
	DefaultBurst       = 2000
	DefaultSilentAfter = 15 * time.Second
)

// Config configures a Monitor. Zero values take the defaults.
type Config struct {
	Instance string
	// Dial connects to the host end of the guest's virtio-serial channel.
	Dial func(ctx context.Context) (io.ReadCloser, error)
	// Events receives one normalised JSON line per event (rotated file).
	Events io.Writer
	// StatusPath is rewritten atomically with the counters every second.
	StatusPath string
	// MaxLine bounds a line in bytes; longer lines are dropped whole.
	MaxLine int
	// Rate and Burst bound the events accepted per second; the rest are
	// dropped and counted (the channel is read at full speed regardless).
	Rate  float64
	Burst int
	// SilentAfter is how long without a heartbeat makes the agent silent.
	SilentAfter time.Duration
	Now         func() time.Time
	Logger      *slog.Logger
}

// Status is the monitor's state, as `abox monitor status` shows it.
type Status struct {
	Instance string    `json:"instance"`
	PID      int       `json:"pid"`
	Started  time.Time `json:"started"`
	Updated  time.Time `json:"updated"`
	// Connected: the channel's host socket is open (the guest is running).
	Connected bool `json:"connected"`
	// LastHeartbeat is when the forwarder last said it was alive (host time).
	LastHeartbeat time.Time         `json:"last_heartbeat,omitzero"`
	Agent         string            `json:"agent,omitempty"`
	AgentUp       bool              `json:"agent_up"`
	LastEvent     time.Time         `json:"last_event,omitzero"`
	Events        uint64            `json:"events"`
	ByType        map[string]uint64 `json:"by_type"`
	Bytes         uint64            `json:"bytes"`
	// EventsPerSec is the accepted rate over the last 10 seconds.
	EventsPerSec    float64 `json:"events_per_sec"`
	DroppedOversize uint64  `json:"dropped_oversize"`
	DroppedRate     uint64  `json:"dropped_rate"`
	DroppedInvalid  uint64  `json:"dropped_invalid"`
	// SilentAfter is the heartbeat gap after which the agent counts as
	// silent.
	SilentAfter time.Duration `json:"silent_after_ns"`
}

// Dropped is the sum of the drop counters.
func (s Status) Dropped() uint64 { return s.DroppedOversize + s.DroppedRate + s.DroppedInvalid }

// Silent reports whether the forwarder has gone quiet at now, and since when
// (its last heartbeat, or the monitor's start when there never was one).
func (s Status) Silent(now time.Time) (bool, time.Time) {
	last := s.LastHeartbeat
	if last.IsZero() {
		last = s.Started
	}
	after := s.SilentAfter
	if after == 0 {
		after = DefaultSilentAfter
	}
	return now.Sub(last) > after, last
}

// ReadStatus reads a status file.
func ReadStatus(path string) (Status, error) {
	var s Status
	b, err := os.ReadFile(path)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("reading monitor status %s: %w", path, err)
	}
	return s, nil
}

// Monitor reads one guest's channel.
type Monitor struct {
	cfg     Config
	limiter *rate.Limiter

	mu     sync.Mutex
	st     Status
	window []uint64 // accepted events per second, the last 10 seconds
}

// New returns a Monitor.
func New(cfg Config) (*Monitor, error) {
	if cfg.Dial == nil || cfg.Events == nil {
		return nil, errors.New("creating monitor: no channel or no event log")
	}
	if cfg.MaxLine <= 0 {
		cfg.MaxLine = DefaultMaxLine
	}
	if cfg.Rate <= 0 {
		cfg.Rate = DefaultRate
	}
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = DefaultSilentAfter
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &Monitor{cfg: cfg, limiter: rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst)}
	m.st = Status{Instance: cfg.Instance, PID: os.Getpid(), Started: cfg.Now().UTC(), ByType: map[string]uint64{}, SilentAfter: cfg.SilentAfter}
	return m, nil
}

// Status returns a snapshot of the counters.
func (m *Monitor) Status() Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st
	s.ByType = make(map[string]uint64, len(m.st.ByType))
	for k, v := range m.st.ByType {
		s.ByType[k] = v
	}
	var sum uint64
	for _, n := range m.window {
		sum += n
	}
	if len(m.window) > 0 {
		s.EventsPerSec = float64(sum) / float64(len(m.window))
	}
	s.Updated = m.cfg.Now().UTC()
	return s
}

// Run reads the channel until ctx ends, reconnecting whenever it closes
// (the guest rebooted, QEMU restarted). Nothing the guest sends ends it.
func (m *Monitor) Run(ctx context.Context) error {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.tick(ctx, done) }()
	defer func() { close(done); wg.Wait(); m.writeStatus() }()
	backoff := 200 * time.Millisecond
	for ctx.Err() == nil {
		rc, err := m.cfg.Dial(ctx)
		if err != nil {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 200 * time.Millisecond
		m.setConnected(true)
		stop := context.AfterFunc(ctx, func() { rc.Close() })
		err = m.Read(rc)
		stop()
		rc.Close()
		m.setConnected(false)
		if err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("monitor channel closed", "instance", m.cfg.Instance, "error", err.Error())
		}
	}
	return nil
}

func (m *Monitor) setConnected(c bool) {
	m.mu.Lock()
	m.st.Connected = c
	m.mu.Unlock()
}

// tick keeps the per-second window and rewrites the status file.
func (m *Monitor) tick(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return
		case <-t.C:
		}
		m.mu.Lock()
		n := m.st.Events
		m.window = append(m.window, n-last)
		if len(m.window) > 10 {
			m.window = m.window[1:]
		}
		last = n
		m.mu.Unlock()
		m.writeStatus()
	}
}

func (m *Monitor) writeStatus() {
	if m.cfg.StatusPath == "" {
		return
	}
	b, err := json.Marshal(m.Status())
	if err != nil {
		return
	}
	if err := fsutil.WriteFileAtomic(m.cfg.StatusPath, append(b, '\n'), 0o600); err != nil {
		m.cfg.Logger.Warn("writing monitor status", "error", err.Error())
	}
}

// Read consumes one connection's stream until it ends. Lines longer than
// MaxLine are dropped whole; lines that are neither a heartbeat nor a
// Tetragon event are dropped; events beyond the rate are dropped.
func (m *Monitor) Read(r io.Reader) error {
	br := bufio.NewReaderSize(r, m.cfg.MaxLine)
	skipping := false
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if !skipping {
				m.count(func(s *Status) { s.DroppedOversize++; s.Bytes += uint64(len(line)) })
			} else {
				m.count(func(s *Status) { s.Bytes += uint64(len(line)) })
			}
			skipping = true
			continue
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		n := uint64(len(line))
		if skipping {
			// The tail of an oversized line.
			skipping = false
			m.count(func(s *Status) { s.Bytes += n })
			continue
		}
		m.handle(line)
	}
}

func (m *Monitor) count(f func(*Status)) {
	m.mu.Lock()
	f(&m.st)
	m.mu.Unlock()
}

func (m *Monitor) handle(line []byte) {
	now := m.cfg.Now()
	n := uint64(len(line))
	if len(line) <= 1 {
		m.count(func(s *Status) { s.Bytes += n })
		return
	}
	if !m.limiter.AllowN(now, 1) {
		m.count(func(s *Status) { s.Bytes += n; s.DroppedRate++ })
		return
	}
	ev, hb, err := Parse(line, now)
	if err != nil {
		m.count(func(s *Status) { s.Bytes += n; s.DroppedInvalid++ })
		return
	}
	if hb != nil {
		m.count(func(s *Status) {
			s.Bytes += n
			s.LastHeartbeat, s.Agent, s.AgentUp = now.UTC(), hb.Agent, hb.AgentUp
		})
		return
	}
	b, err := json.Marshal(ev)
	if err != nil {
		m.count(func(s *Status) { s.Bytes += n; s.DroppedInvalid++ })
		return
	}
	if _, err := m.cfg.Events.Write(append(b, '\n')); err != nil {
		m.cfg.Logger.Warn("writing monitor event", "error", err.Error())
	}
	m.count(func(s *Status) {
		s.Bytes += n
		s.Events++
		s.ByType[ev.Type]++
		s.LastEvent = now.UTC()
	})
}
