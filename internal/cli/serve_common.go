package cli

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/abox-dev/abox/internal/decisionlog"
	"github.com/abox-dev/abox/internal/logring"
	"github.com/abox-dev/abox/internal/netclass"
)

// parsePermit parses the values of one address-range flag (--allow-private,
// --allow-host): CIDRs, or single addresses. Warnings (a range wider than a
// site) go to warn.
func parsePermit(flag string, list []string, warn io.Writer) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		p, w, err := netclass.ParsePermit(flag, s)
		if err != nil {
			return nil, err
		}
		if w != "" {
			fmt.Fprintf(warn, "warning: %s\n", w)
		}
		out = append(out, p)
	}
	return out, nil
}

// allowHostUsage is the help of --allow-host, the same for every command.
const allowHostUsage = "CIDR the guest may reach even though it holds host addresses, loopback or other instances' networks, repeatable (--allow-private never opens those)"

// serveLogs is the logging of a foreground filter: decision lines encoded on
// the hot path and written in batches to the log file (or stderr) and to the
// ring the local API serves; diagnostics join the same stream.
type serveLogs struct {
	decisions *decisionlog.Writer
	ring      *logring.Ring
	diag      *slog.Logger
	file      *os.File // nil when writing to stderr
}

func openServeLogs(e *env, logFile string) (*serveLogs, error) {
	var out io.Writer = e.stderr
	var f *os.File
	if logFile != "" {
		if err := os.MkdirAll(filepath.Dir(logFile), 0o755); err != nil {
			return nil, fmt.Errorf("opening --log-file: %w", err)
		}
		var err error
		if f, err = os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640); err != nil {
			return nil, fmt.Errorf("opening --log-file: %w", err)
		}
		out = f
	}
	ring := logring.New(2000)
	dlog := decisionlog.New(decisionlog.Config{Sinks: []io.Writer{out, ring}})
	return &serveLogs{decisions: dlog, ring: ring, diag: slog.New(slog.NewJSONHandler(dlog, nil)), file: f}, nil
}

// Close flushes the decision lines, then closes the file.
func (s *serveLogs) Close() {
	s.decisions.Close()
	if s.file != nil {
		s.file.Close()
	}
}
