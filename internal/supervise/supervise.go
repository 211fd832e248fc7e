// Package supervise keeps one child process running: it restarts the child
// whenever it exits, with backoff, until the context ends, and then stops it
// with a deadline.
package supervise

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"syscall"
	"time"
)

// Config describes the child.
type Config struct {
	// Argv is the program and its arguments; Env its environment.
	Argv []string
	Env  []string
	// Log receives the child's output and one line per restart.
	Log io.Writer
	// What names the child in restart lines ("monitor").
	What string
	// StopTimeout bounds the child's shutdown after SIGTERM; 0 means 8s.
	StopTimeout time.Duration
}

// Run runs the child until ctx ends.
func Run(ctx context.Context, c Config) error {
	if c.StopTimeout == 0 {
		c.StopTimeout = 8 * time.Second
	}
	backoff := 200 * time.Millisecond
	for {
		cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
		cmd.Env = c.Env
		cmd.Stdout, cmd.Stderr = c.Log, c.Log
		started := time.Now()
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting %s: %w", c.What, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-ctx.Done():
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(c.StopTimeout):
				cmd.Process.Kill()
				<-done
			}
			return nil
		case err := <-done:
			fmt.Fprintf(c.Log, "{\"time\":%q,\"level\":\"ERROR\",\"msg\":\"%s exited; restarting\",\"error\":%q,\"backoff\":%q}\n",
				time.Now().UTC().Format(time.RFC3339Nano), c.What, fmt.Sprint(err), backoff.String())
		}
		if time.Since(started) > 30*time.Second {
			backoff = 200 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}
