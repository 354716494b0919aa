package l7proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"time"
)

// Supervisor runs the proxy process and restarts it with backoff when
// it exits. A restarted proxy subscribes again and gets the whole
// current configuration from the xDS server (its acknowledgement
// completes the waits still pending).
type Supervisor struct {
	// Path and Args are the proxy's executable and arguments.
	Path string
	Args []string
	// MinBackoff and MaxBackoff bound the delay before a restart; the
	// delay doubles per exit and resets after a run of StableAfter.
	MinBackoff, MaxBackoff, StableAfter time.Duration
	Log                                 *slog.Logger

	mu       sync.Mutex
	pid      int
	restarts int
	lastExit string
}

// SupervisorStatus is what GET /v1/actors shows of the proxy process.
type SupervisorStatus struct {
	PID      int    `json:"pid"`
	Restarts int    `json:"restarts"`
	LastExit string `json:"lastExit,omitempty"`
}

// Status returns the process's state.
func (s *Supervisor) Status() SupervisorStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SupervisorStatus{PID: s.pid, Restarts: s.restarts, LastExit: s.lastExit}
}

// Run starts the proxy and keeps it running until ctx ends, then kills
// it and waits for it.
func (s *Supervisor) Run(ctx context.Context) error {
	if s.Path == "" {
		return errors.New("proxy supervisor: no executable")
	}
	backoff := s.MinBackoff
	for {
		start := time.Now()
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(start) >= s.StableAfter {
			backoff = s.MinBackoff
		}
		s.mu.Lock()
		s.restarts++
		s.lastExit = fmt.Sprint(err)
		s.pid = 0
		s.mu.Unlock()
		s.Log.Warn("proxy exited; restarting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, s.MaxBackoff)
	}
}

func (s *Supervisor) runOnce(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, s.Path, s.Args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start proxy: %w", err)
	}
	s.mu.Lock()
	s.pid = cmd.Process.Pid
	s.mu.Unlock()
	s.Log.Info("proxy started", "pid", cmd.Process.Pid)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("proxy pid %d: %w", cmd.Process.Pid, err)
	}
	return fmt.Errorf("proxy exited")
}
