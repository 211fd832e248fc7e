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
)

// parsePermit parses --allow-private values: CIDRs, or single addresses.
func parsePermit(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("--allow-private %q: not a CIDR (write for example 10.20.0.0/16 or fd00::/8)", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

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
