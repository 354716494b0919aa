package actors

import "github.com/asynkron/protoactor-go/actor"

// owner is what the node-wide actors (ipcache, nodes, services, policy,
// ipam, identity, gc) share: the requester they wait with, the batch of
// their index writes, their reconciler's timer, and the lifecycle
// messages around them, handled here once instead of in every Receive
// (protoactor's receive-middleware idea, kept as a plain call so the
// actor's type switch stays one place).
type owner struct {
	req   requester
	batch batcher // zero for an actor without index writes: flush does nothing
	// rec is the actor's reconciler (reconciler.init sets it); nil if it
	// has none.
	rec reconcileHooks
	// asksNobody spares an actor that never waits for an answer (ipam,
	// identity) its answers process.
	asksNobody bool

	// The actor's hooks, each optional: onStart builds its state (from
	// the index: Started, also after a restart); onStop stops its timers
	// (Stopping and Restarting: an armed timer's closure would keep the
	// system reachable; the reconciler's is stopped here); onRestart runs
	// before the last flush of a failed incarnation.
	onStart   func(ctx actor.Context)
	onStop    func()
	onRestart func(ctx actor.Context)
}

// lifecycle handles ctx's message if it is a lifecycle message, a
// request's answer, the reconciler's retry or an index flush, and
// reports whether it did; the actor handles everything else itself.
func (o *owner) lifecycle(ctx actor.Context) bool {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		if !o.asksNobody {
			o.req.register(ctx)
		}
		if o.onStart != nil {
			o.onStart(ctx)
		}
	case *actor.Stopped:
		o.req.unregister(ctx)
	case *requestAnswer:
		o.req.answered(msg)
	case *reconcileRetry:
		if o.rec != nil {
			o.rec.retried(ctx)
		}
	case *actor.Stopping:
		o.stop()
		o.batch.flush()
	case *actor.Restarting:
		o.stop()
		if o.onRestart != nil {
			o.onRestart(ctx)
		}
		o.batch.flush()
	case *flushIndex:
		o.batch.flush()
	default:
		return false
	}
	return true
}

// stop drops the pending requests and stops the timers.
func (o *owner) stop() {
	o.req.drop()
	if o.rec != nil {
		o.rec.stop()
	}
	if o.onStop != nil {
		o.onStop()
	}
}

// reconcileReport returns what introspection shows of the actor's
// reconciler; false if it has none.
func (o *owner) reconcileReport() (ReconcilerSnapshot, bool) {
	if o.rec == nil {
		return ReconcilerSnapshot{}, false
	}
	return o.rec.report(), true
}
