package api

import (
	"context"
	"errors"
	"testing"
)

// TestAttachLocks: one attach per attachment at a time; another
// attachment (other interface, other container) is not held up; a waiter
// proceeds once the holder is done, and its wait ends with its context.
func TestAttachLocks(t *testing.T) {
	var l attachLocks
	ctx := context.Background()
	unlock, waited, err := l.lock(ctx, "c1", "eth0")
	if err != nil || waited {
		t.Fatalf("first lock: waited %v, %v", waited, err)
	}
	for _, other := range [][2]string{{"c1", "net1"}, {"c2", "eth0"}} {
		u, waited, err := l.lock(ctx, other[0], other[1])
		if err != nil || waited {
			t.Fatalf("lock %v while c1/eth0 held: waited %v, %v", other, waited, err)
		}
		u()
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, waited, err := l.lock(cctx, "c1", "eth0"); !errors.Is(err, context.Canceled) || !waited {
		t.Fatalf("lock with a cancelled context while held: waited %v, %v; want context.Canceled", waited, err)
	}

	type result struct {
		unlock func()
		waited bool
		err    error
	}
	got := make(chan result, 1)
	go func() {
		u, w, err := l.lock(ctx, "c1", "eth0")
		got <- result{u, w, err}
	}()
	unlock()
	r := <-got
	if r.err != nil {
		t.Fatalf("lock after the holder is done: %v", r.err)
	}
	r.unlock()
	if len(l.busy) != 0 {
		t.Fatalf("entries left: %v", l.busy)
	}
}
