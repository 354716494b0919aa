package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// attachWaitTimeout bounds how long an attach waits for an earlier one
// of the same attachment that is still in flight (the caller's own
// deadline, the plugin's agentTimeout, usually ends the wait first).
const attachWaitTimeout = time.Minute

// attachLocks serialises the attaches of one attachment (container ID
// and interface name): a runtime that retries an ADD the plugin gave up
// on (its agentTimeout expired) sends a second ADD while the agent still
// runs the first. Run together, the two race for the attachment's veth
// name, its endpoint and its addresses: the retry replaces an earlier
// attachment only through the index, where an endpoint still being
// created is not yet, so its own creation met the endpoint manager's
// uniqueness check (409), or the first, finishing last, replaced the
// retry's. Serialised, the retry waits for the first to finish (or roll
// back) and then replaces what it left, as docs/install.md says. Cilium
// serialises its ADDs per container ID the same way. One entry per
// attach in flight: bounded by MaxInFlight.
type attachLocks struct {
	mu   sync.Mutex
	busy map[attachKey]chan struct{} // closed when the holder is done
}

type attachKey struct{ containerID, ifName string }

// LockAttachment takes the attachment (containerID, ifName) as an attach
// or a delete through the API does, for the agent's delete-queue drain;
// the caller runs release when done.
func (s *Server) LockAttachment(ctx context.Context, containerID, ifName string) (release func(), err error) {
	release, _, err = s.attaching.lock(ctx, containerID, ifName)
	return release, err
}

// lock waits until no other attach of (containerID, ifName) is in flight
// and takes the attachment, or fails when ctx ends or the wait reaches
// attachWaitTimeout (503 attachment-busy). waited reports that it had to
// wait. The caller runs unlock when done.
func (l *attachLocks) lock(ctx context.Context, containerID, ifName string) (unlock func(), waited bool, err error) {
	key := attachKey{containerID, ifName}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		l.mu.Lock()
		held, ok := l.busy[key]
		if !ok {
			if l.busy == nil {
				l.busy = make(map[attachKey]chan struct{})
			}
			done := make(chan struct{})
			l.busy[key] = done
			l.mu.Unlock()
			return func() {
				l.mu.Lock()
				delete(l.busy, key)
				l.mu.Unlock()
				close(done)
			}, waited, nil
		}
		l.mu.Unlock()
		waited = true
		if timer == nil {
			timer = time.NewTimer(attachWaitTimeout)
		}
		select {
		case <-held:
		case <-ctx.Done():
			return nil, waited, fmt.Errorf("wait for an earlier attach of container %s interface %q: %w", containerID, ifName, ctx.Err())
		case <-timer.C:
			return nil, waited, &apiError{http.StatusServiceUnavailable, CodeAttachmentBusy,
				fmt.Sprintf("an earlier attach of container %s interface %q is still in flight after %s; retry", containerID, ifName, attachWaitTimeout)}
		}
	}
}
