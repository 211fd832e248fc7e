package policy

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// watchDebounce lets an editor finish a burst of writes/renames before the
// file is read; it keeps reloads well within the one-second promise.
const watchDebounce = 150 * time.Millisecond

// Watch reloads the allowlist whenever its file changes, until ctx ends. It
// watches the directory rather than the file, so editors that write a
// temporary file and rename it over the original, or delete and recreate it,
// are followed. A rejected reload keeps the previous list (see Reload).
func (e *Engine) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching allowlist: %w", err)
	}
	defer w.Close()
	dir := filepath.Dir(e.path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watching allowlist directory %s: %w", dir, err)
	}
	base := filepath.Clean(e.path)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if filepath.Clean(ev.Name) != base {
				continue
			}
			timer.Reset(watchDebounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			e.log.Warn("allowlist watch error", "error", err.Error())
		case <-timer.C:
			e.mu.Lock()
			// A missing file during delete-then-recreate is reported and
			// retried on the next event; the old list stays meanwhile.
			_ = e.reloadLocked("file change") // the error is recorded in Status and logged
			e.mu.Unlock()
		}
	}
}
