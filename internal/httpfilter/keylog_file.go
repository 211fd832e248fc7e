package httpfilter

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// openKeyLog appends to the key log, creating it 0600: the keys decrypt
// everything the guest sent.
func openKeyLog(path string) (io.WriteCloser, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("enabling key log: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("enabling key log: %w", err)
	}
	return f, nil
}
