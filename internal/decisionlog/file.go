package decisionlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/natefinch/lumberjack.v2"
)

// Size cap of a decision log file (DefaultMaxFileMB per file, DefaultBackups
// rotated files kept): a guest cannot fill the host's disk through its logs,
// whatever it sends.
const (
	DefaultMaxFileMB = 50
	DefaultBackups   = 3
)

// RefusalsPath is where the refusal stream of the decision log at path is
// kept (Config.Kept): dns.log's in dns.refusals.log. Its rotated files
// (dns.refusals-TIMESTAMP.log) never match dns.log's (dns-TIMESTAMP.log),
// so neither file's rotation removes the other's.
func RefusalsPath(path string) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(path, ext) + ".refusals" + ext
}

// FileConfig configures OpenFile.
type FileConfig struct {
	// MaxMB is the size at which the file is rotated (DefaultMaxFileMB if <= 0).
	MaxMB int
	// Backups is how many rotated files are kept (DefaultBackups if <= 0).
	Backups int
}

// OpenFile opens path for appending decision lines, rotated by size:
// path.log is renamed to path-TIMESTAMP.log when it reaches MaxMB, and only
// the newest Backups such files are kept, so the log of one instance never
// takes more than (Backups+1)*MaxMB. The directory is created private
// (0700) and the files are 0600. Close the result after the Writer.
func OpenFile(path string, cfg FileConfig) (*lumberjack.Logger, error) {
	if cfg.MaxMB <= 0 {
		cfg.MaxMB = DefaultMaxFileMB
	}
	if cfg.Backups <= 0 {
		cfg.Backups = DefaultBackups
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("opening log %s: %w", path, err)
	}
	// lumberjack opens lazily; open once now so that an unwritable path is
	// an error at start, not a counter later. It keeps the mode of an
	// existing file and creates new ones 0600.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening log %s: %w", path, err)
	}
	f.Close()
	return &lumberjack.Logger{Filename: path, MaxSize: cfg.MaxMB, MaxBackups: cfg.Backups}, nil
}
