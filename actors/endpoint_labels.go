package actors

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/membrane-cni/membrane/pkg/domain/labels"
)

// labelWrite tracks label changes until they are durable: a PATCH of
// labels answers once a state write carrying the new labels (the
// regeneration's, which follows every identity change) is on disk.
// Allocated on the first change and dropped when everything is answered,
// so endpoints that are never relabelled pay one pointer.
type labelWrite struct {
	// waiters have their labels set (identity resolved) and wait for a
	// durable write; the first inFlight of them are covered by the write
	// in flight, whose labels are writing.
	waiters  []*actor.PID
	inFlight int
	writing  labels.Labels
	busy     bool // a write is in flight
	// dirty: the labels changed since the last durable write.
	dirty bool
}

// labelsChanged notes that the endpoint's labels are not durable yet.
func (a *endpointActor) labelsChanged() {
	if a.deps.store == nil {
		return
	}
	if a.lw == nil {
		a.lw = &labelWrite{}
	}
	a.lw.dirty = true
}

// labelsNotDurable reports whether an unchanged-labels PATCH must wait,
// and queues its waiter if so.
func (a *endpointActor) labelsNotDurable(waiter *actor.PID) bool {
	switch {
	case a.lw == nil || !a.lw.dirty:
		return false
	case a.leaseWait && len(a.labelWaiters) > 0: // the identity for them is in flight
		a.labelWaiters = append(a.labelWaiters, waiter)
	default:
		a.lw.waiters = append(a.lw.waiters, waiter)
		if a.lw.busy && a.lw.writing.Equal(a.ep.Labels) {
			a.lw.inFlight = len(a.lw.waiters) // the write in flight carries them
		}
	}
	return true
}

// awaitLabelWrite moves label waiters whose identity is resolved to wait
// for the next durable state write. Without a store they are answered at
// once (after the index commit).
func (a *endpointActor) awaitLabelWrite(ctx actor.Context, waiters []*actor.PID) {
	if len(waiters) == 0 {
		return
	}
	if a.deps.store == nil {
		a.publish(ctx, replies(waiters, a.result(nil))...)
		return
	}
	a.labelsChanged() // a restarted incarnation cannot know they are on disk
	a.lw.waiters = append(a.lw.waiters, waiters...)
	a.publish(ctx) // the new identity, in the index before the write
}

// labelWriteStarted is called when a state write of the current record is
// submitted: it covers the waiters queued so far.
func (a *endpointActor) labelWriteStarted() {
	if a.lw != nil {
		a.lw.inFlight, a.lw.writing, a.lw.busy = len(a.lw.waiters), a.ep.Labels, true
	}
}

// labelWriteDone answers the waiters the finished write covered.
func (a *endpointActor) labelWriteDone(ctx actor.Context, err error) {
	lw := a.lw
	if lw == nil {
		return
	}
	if err == nil && lw.writing.Equal(a.ep.Labels) {
		lw.dirty = false
	}
	n := min(lw.inFlight, len(lw.waiters))
	done := lw.waiters[:n:n]
	lw.waiters, lw.inFlight, lw.writing, lw.busy = lw.waiters[n:], 0, nil, false
	if len(lw.waiters) == 0 && !lw.dirty {
		a.lw = nil
	}
	if n == 0 {
		return
	}
	if err != nil {
		err = fmt.Errorf("patch labels of endpoint %d: %w", a.ep.ID, err)
	}
	a.publish(ctx, replies(done, a.result(err))...)
}

// labelDurableWaiters takes the waiters for a durable write (delete and
// restart hand them on).
func (a *endpointActor) labelDurableWaiters() []*actor.PID {
	if a.lw == nil {
		return nil
	}
	ws := a.lw.waiters
	a.lw = nil
	return ws
}
