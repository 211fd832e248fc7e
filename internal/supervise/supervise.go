// Package supervise keeps one child process running: it restarts the child
// whenever it exits, with backoff, until the context ends, and then stops it
// with a deadline. It is the one restart loop of abox: the filter daemon's
// supervisor, the monitor's and each port forward's use it.
package supervise

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
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
	// Attrs are added to the JSON restart line ("instance", "dev").
	Attrs map[string]string
	// Prepare, when set, is called with each new command before it
	// starts (extra files, environment); release, when not nil, runs
	// once the child has started or failed to.
	Prepare func(*exec.Cmd) (release func(), err error)
	// DieWithParent kills the child when the supervising process dies
	// (Pdeathsig), so that no orphan keeps running unsupervised.
	DieWithParent bool
	// StopTimeout bounds the child's shutdown after SIGTERM; 0 means 8s.
	StopTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a restart; 0 means
	// 200ms and 5s. The wait doubles on each quick exit and starts again
	// from MinBackoff after a child that ran for 30s.
	MinBackoff, MaxBackoff time.Duration
}

// Run runs the child until ctx ends. It returns an error only when a child
// cannot be started at all.
func Run(ctx context.Context, c Config) error {
	if c.StopTimeout == 0 {
		c.StopTimeout = 8 * time.Second
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = 200 * time.Millisecond
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 5 * time.Second
	}
	backoff := c.MinBackoff
	for {
		started := time.Now()
		done, stop, err := c.start()
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			stop()
			return nil
		case err := <-done:
			c.restartLine(err, backoff)
		}
		if time.Since(started) > 30*time.Second {
			backoff = c.MinBackoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, c.MaxBackoff)
	}
}

// start starts one child. done yields its exit; stop asks it to end
// (SIGTERM, then SIGKILL after StopTimeout) and waits for it.
func (c Config) start() (done <-chan error, stop func(), err error) {
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = c.Env
	cmd.Stdout, cmd.Stderr = c.Log, c.Log
	if c.DieWithParent {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	}
	if c.Prepare != nil {
		release, err := c.Prepare(cmd)
		if err != nil {
			return nil, nil, fmt.Errorf("preparing %s: %w", c.What, err)
		}
		if release != nil {
			defer release()
		}
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("starting %s: %w", c.What, err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-ch:
		case <-time.After(c.StopTimeout):
			cmd.Process.Kill()
			<-ch
		}
	}
	return ch, stop, nil
}

// restartLine logs one JSON line for a child that exited.
func (c Config) restartLine(err error, backoff time.Duration) {
	rec := maps.Clone(c.Attrs)
	if rec == nil {
		rec = map[string]string{}
	}
	rec["time"] = time.Now().UTC().Format(time.RFC3339Nano)
	rec["level"] = "ERROR"
	rec["msg"] = c.What + " exited; restarting"
	rec["error"] = fmt.Sprint(err)
	rec["backoff"] = backoff.String()
	b, _ := json.Marshal(rec)
	c.Log.Write(append(b, '\n'))
}
